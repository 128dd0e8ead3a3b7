"""Messages a provider showed a check: parsed once per process, recorded
once in the database."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

from sqlalchemy import Connection

from app.db import messages as messages_db
from app.domain.ids import new_id
from app.domain.inbox_query import normalise_message_id
from app.domain.mail import ParsedMail, parse_mail
from app.domain.mail.bounds import has_bare_lf
from app.domain.whole_message import attachment_count
from app.providers.base import ProviderMessage


class Observed(NamedTuple):
    """A recorded message: our id, what the provider gave, and its parse;
    `recorded_now`: the call that returned it recorded it, in the caller's
    transaction (no one else knows its id before that commits, so no signal
    has the message yet)."""

    message_id: str
    message: ProviderMessage
    mail: ParsedMail
    recorded_now: bool = False

    @property
    def delivered_to(self) -> list[str]:
        """The recipients it was delivered to: the envelope's where the
        provider knows them (the sink), else To and Cc. Who may see it
        follows these (`app.usecases.visibility`), never a header the
        sender wrote beside the envelope."""
        return delivered_to(self.message, self.mail)


def delivered_to(message: ProviderMessage, mail: ParsedMail) -> list[str]:
    if message.envelope_recipients:
        return sorted({a.lower() for a in message.envelope_recipients})
    return sorted({a.lower() for a in (*mail.to, *mail.cc)})


_PARSED: OrderedDict[tuple[str, str], ParsedMail] = OrderedDict()
PARSED_CACHE_ENTRIES = 4096
_PARSED_LOCK = threading.Lock()
# How this process parses a message it matches. A worker parses in its own
# main thread, where parse_mail's CPU budget applies; the sink and the API,
# whose checks run in threads beside their event loops, parse in a parse pool
# (a message of at most 16 KiB in the check's own thread: app/infra/parse_pool.py).
_parse: Callable[[bytes], ParsedMail] = parse_mail


def parse_with(parse: Callable[[bytes], ParsedMail]) -> Callable[[bytes], ParsedMail]:
    """Make this process's checks parse messages with `parse`; returns the
    previous one (to put back)."""
    global _parse
    previous, _parse = _parse, parse
    return previous


def parse_received(raw: bytes) -> ParsedMail:
    """Parse one message as this process's checks do (see `parse_with`), uncached."""
    return _parse(raw)


def _parsed(provider: str, message: ProviderMessage) -> ParsedMail:
    """parse_mail, remembered per (provider, message id): a message never
    changes under its id, and every check of a mailbox sees it again."""
    key = (provider, message.provider_message_id)
    with _PARSED_LOCK:
        mail = _PARSED.get(key)
        if mail is not None:
            _PARSED.move_to_end(key)
            return mail
    mail = _parse(message.raw)
    with _PARSED_LOCK:
        _PARSED[key] = mail
        if len(_PARSED) > PARSED_CACHE_ENTRIES:
            _PARSED.popitem(last=False)
    return mail


def forget_parsed() -> None:
    """Forget every remembered parse. A message id is unique within one
    database: a process that moves to another (a test's own database) must
    not take its messages for the earlier one's."""
    with _PARSED_LOCK:
        _PARSED.clear()


# Text the inbox's free words are looked up in: the subject and the first
# 256 KiB of the text (a tsvector holds at most 1 MiB).
WORDS_MAX_BYTES = 256 * 1024


def inbox_columns(raw: bytes, mail: ParsedMail) -> dict[str, object]:
    """What the inbox lists and searches a message by (`messages` columns)."""
    return {
        "from_addr": mail.from_addr,
        "to_addrs": list(mail.to),
        "cc_addrs": list(mail.cc),
        "header_message_id": normalise_message_id(mail.message_id_header),
        "attachments": attachment_count(raw),
        "words": mail.subject + "\n" + mail.searchable_text(WORDS_MAX_BYTES),
    }


def record_messages(
    session: Connection, provider: str, messages: Sequence[ProviderMessage]
) -> list[Observed]:
    """Record each observed message once; return every one with our id.
    Whether a message is recorded already is asked of the database unless
    the provider's answer told (`ProviderMessage.recorded_known`)."""
    if not messages:
        return []
    parsed = [(m, _parsed(provider, m), m.message_id or new_id("msg")) for m in messages]
    ids = messages_db.message_record_new(
        session,
        provider,
        [
            {
                "id": our_id,
                "provider": provider,
                "provider_message_id": m.provider_message_id,
                "received_at": m.received_at,
                "subject": p.subject,
                "recipients": sorted({a.lower() for a in (*m.envelope_recipients, *p.to, *p.cc)}),
                "delivered_to": delivered_to(m, p),
                "run_marker": p.run_marker,
                "size": len(m.raw),
                "bare_lf": has_bare_lf(m.raw),
                "auth_namespace": m.auth_namespace,
                "raw": m.raw,
                **inbox_columns(m.raw, p),
            }
            for m, p, our_id in parsed
        ],
        known={m.provider_message_id: m.recorded_id for m in messages if m.recorded_known},
    )
    # The id this call made up is the one recorded only if this call's
    # insert recorded the message (ids are unique, never reused).
    return [
        Observed(ids[m.provider_message_id], m, p, ids[m.provider_message_id] == our_id)
        for m, p, our_id in parsed
        if m.provider_message_id in ids
    ]
