"""Use cases of the SMTP sink: store a received message, then widen its recipients.

The sink answers ``250`` once the raw bytes are stored (:func:`store`), with the
envelope recipients as the message's recipients. Everything else comes after,
off the SMTP path: :func:`push` checks the envelope recipients' signals at
once; the message is parsed (the sink does it in a worker process,
``app/smtp/parsing.py``); :func:`add_header_recipients` then adds the To and
Cc addresses the envelope did not name, and pushes theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from app import signals
from app.db import messages as messages_repo
from app.db.engine import transaction
from app.domain.ids import recipient_hash
from app.domain.mail import ParsedMail, bounds_exceeded, header_recipients_within, parse_mail
from app.providers.runtime import provider_configs
from app.settings import Settings

log = logging.getLogger("signalbox.sink")


def store(
    settings: Settings, mail_from: str | None, envelope_rcpts: Sequence[str], raw: bytes
) -> int:
    """Store one message raw (nothing is parsed) with its envelope recipients.
    Returns the sink id."""
    envelope = sorted({r.lower() for r in envelope_rcpts})
    with transaction() as session:
        sink_id, _ = messages_repo.sink_message_store(
            session,
            mail_from=mail_from,
            envelope_recipients=envelope,
            all_recipients=envelope,
            raw=raw,
        )
    log.info(
        "message received",
        extra={
            "event": "sink_received",
            "sink_message_id": sink_id,
            "size": len(raw),
            "recipient_hashes": [recipient_hash(r) for r in envelope],
        },
    )
    return sink_id


def add_header_recipients(
    settings: Settings, sink_id: int, envelope_rcpts: Sequence[str], mail: ParsedMail
) -> list[str]:
    """Add the To and Cc addresses of the parsed message that the envelope did
    not name to the stored message, and check their signals. Returns them."""
    envelope = {r.lower() for r in envelope_rcpts}
    extra = sorted({*mail.to, *mail.cc} - envelope)
    log.info(
        "message parsed",
        extra={
            "event": "sink_parsed",
            "sink_message_id": sink_id,
            "defects": len(mail.defects),
            # The bounds the message hit (parsed on a bounded view), if any.
            "reason": ",".join(bounds_exceeded(mail)) or None,
            "recipient_hashes": [recipient_hash(r) for r in extra],
        },
    )
    if not extra:
        return []
    with transaction() as session:
        messages_repo.sink_message_add_recipients(session, sink_id, extra)
    push(settings, sink_id, extra)
    return extra


def receive(
    settings: Settings, mail_from: str | None, envelope_rcpts: Sequence[str], raw: bytes
) -> int:
    """Store, parse here (bounded), and widen: the whole intake in one call, for
    callers that have no sink event loop to keep free."""
    sink_id = store(settings, mail_from, envelope_rcpts, raw)
    push(settings, sink_id, envelope_rcpts)
    add_header_recipients(settings, sink_id, envelope_rcpts, parse_mail(raw))
    return sink_id


def push_then_triage(
    settings: Settings, sink_id: int, envelope_rcpts: Sequence[str], raw: bytes | None
) -> bool:
    """Push the envelope recipients' signals; then whether the message must be
    parsed for more recipients: not when its To and Cc plainly name only
    envelope recipients (the usual case), so no parse is spent on it."""
    push(settings, sink_id, envelope_rcpts)
    return raw is None or not header_recipients_within(raw, list(envelope_rcpts))


def push(settings: Settings, sink_id: int, recipients: Iterable[str]) -> None:
    """Check the waiting signals of every sink-type provider for ``recipients``
    at once. Never raises: a lost push only means the signals find the stored
    message at their next scheduled check."""
    recipients = sorted({r.lower() for r in recipients})
    if not recipients:
        return
    for name, config in provider_configs(settings).items():
        if config.type != "sink":
            continue
        try:
            signals.push(name, recipients)
        except Exception as exc:
            log.warning(
                "push after receipt failed; signals will find the message at their next check",
                extra={
                    "event": "push_failed",
                    "sink_message_id": sink_id,
                    "provider": name,
                    "error": type(exc).__name__,
                },
            )
