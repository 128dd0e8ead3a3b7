"""Deliveries the SMTP sink refused, and the sentence a dead letter makes of one.

Pure. The sink records each refused attempt (when, the envelope recipients
it knew, the reply code, why; never content or credentials); when a signal
expires with no match, the refusal of a delivery to its recipient within its
window is the most likely cause, and its recommendation names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class RefusalReason(StrEnum):
    """Why the sink refused a delivery (`signalbox_smtp_refused_total{reason}`)."""

    RECIPIENT_DOMAIN = "recipient_domain"  # 550: outside SIGNALBOX_SMTP_DOMAINS
    TOO_MANY_RECIPIENTS = "too_many_recipients"  # 452
    MESSAGE_TOO_LARGE = "message_too_large"  # 552
    LINE_TOO_LONG = "line_too_long"  # 500
    CHAOS = "chaos"  # a namespace's chaos rule answered
    AUTH_FAILED = "auth_failed"  # 535
    AUTH_REQUIRED = "auth_required"  # 530: MAIL without AUTH
    STARTTLS_REQUIRED = "starttls_required"  # 530: MAIL before STARTTLS
    TLS_ON_PLAIN_PORT = "tls_on_plain_port"  # a TLS hello on the plain port (no recipient)


# A refusal's detail and recipients as kept: a reply text is short, and the
# recipients of one attempt are at most SIGNALBOX_SMTP_MAX_RECIPIENTS.
DETAIL_MAX = 200


@dataclass(frozen=True)
class Refusal:
    """One refused delivery attempt. `recipients` is empty when it was refused
    before RCPT TO (AUTH, MAIL); `detail` the reply's text (no content)."""

    refused_at: datetime
    code: int
    reason: str
    detail: str = ""
    recipients: tuple[str, ...] = ()


def mib(size: int) -> str:
    """A size as a person reads it: 31 MiB, 1.5 MiB, 29 KiB, 800 bytes."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale:
            value = size / scale
            text = f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"
            return f"{text} {unit}"
    return f"{size} bytes"


def too_large_detail(size: int | None, limit: int) -> str:
    """The reply text of a message over the size limit, with both sizes when known."""
    if size is None:
        return f"message too large (over {mib(limit)})"
    return f"message too large ({mib(size)} > {mib(limit)})"


_FIX = {
    RefusalReason.RECIPIENT_DOMAIN: (
        "add the recipient's domain to SIGNALBOX_SMTP_DOMAINS or send to an accepted domain"
    ),
    RefusalReason.TOO_MANY_RECIPIENTS: (
        "send to fewer recipients per message or raise SIGNALBOX_SMTP_MAX_RECIPIENTS"
    ),
    RefusalReason.MESSAGE_TOO_LARGE: (
        "raise SIGNALBOX_SMTP_MAX_BYTES or send a smaller attachment"
    ),
    RefusalReason.LINE_TOO_LONG: (
        "wrap the message's lines (at most 998 bytes each) or send it as quoted-printable or base64"
    ),
    RefusalReason.CHAOS: "remove or narrow the chaos rule if this failure was not intended",
    RefusalReason.AUTH_FAILED: (
        "send a namespace's API token as the SMTP password, or set SIGNALBOX_SMTP_AUTH=optional"
    ),
    RefusalReason.AUTH_REQUIRED: (
        "give the application SMTP credentials (a namespace's API token as the password),"
        " or set SIGNALBOX_SMTP_AUTH=optional"
    ),
    RefusalReason.STARTTLS_REQUIRED: (
        "turn on STARTTLS in the application's mail settings, use the SMTPS port,"
        " or set SIGNALBOX_SMTP_TLS=on"
    ),
    RefusalReason.TLS_ON_PLAIN_PORT: (
        "point an implicit-TLS client at the SMTPS port, or use STARTTLS on the plain port"
    ),
}


def fix_for(reason: str) -> str:
    try:
        return _FIX[RefusalReason(reason)]
    except ValueError:
        return "see the sink's log for this refusal"


def most_telling(refusals: Sequence[Refusal], recipient: str) -> Refusal | None:
    """The refusal a dead letter names: the latest one of a delivery to
    `recipient`, else the latest one refused before any recipient was named
    (AUTH, MAIL); a TLS hello on the plain port is attributed to nothing."""
    recipient = recipient.strip().lower()
    to_it = [r for r in refusals if recipient in (a.lower() for a in r.recipients)]
    unnamed = [
        r
        for r in refusals
        if not r.recipients and r.reason != RefusalReason.TLS_ON_PLAIN_PORT.value
    ]
    for group in (to_it, unnamed):
        if group:
            return max(group, key=lambda r: r.refused_at)
    return None


def refusal_sentence(refusal: Refusal, recipient: str) -> str:
    """The recommendation of a dead letter whose delivery the sink refused."""
    when = refusal.refused_at.astimezone(UTC).strftime("%H:%M:%S UTC")
    reply = f"{refusal.code} {refusal.detail}".strip() if refusal.code else refusal.detail
    if refusal.recipients:
        who = f"An SMTP client tried to deliver to {_address(recipient)} at {when} and was refused"
    else:
        who = (
            f"No delivery to {_address(recipient)} reached the sink, but at {when} an SMTP"
            " client was refused before it named its recipients"
        )
    return f"{who}: {reply}: {fix_for(refusal.reason)}."


def _address(value: str, limit: int = 254) -> str:
    value = "".join(ch for ch in value.strip() if ch.isprintable())
    return value[:limit]
