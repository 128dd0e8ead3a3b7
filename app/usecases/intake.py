"""Use cases of the SMTP sink: store a received message, then widen its recipients.

The sink answers ``250`` once the raw bytes are stored (:func:`store_many`,
the messages that arrived meanwhile in one transaction), with the envelope
recipients as the message's recipients. Everything else comes after,
off the SMTP path: :func:`push_many` checks the envelope recipients' signals
at once (the pushes waiting meanwhile in one); the message is parsed (the
sink does it in a worker process, ``app/infra/parse_pool.py``);
:func:`add_header_recipients` then adds the To and Cc addresses the envelope
did not name, and pushes theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from app.db import server as server_db
from app.db import sink_messages as sink_messages_db
from app.db.engine import autocommit, transaction
from app.domain.mail import (
    ParsedMail,
    bounds_exceeded,
    header_block_recipients,
    header_recipients_within,
)
from app.infra import dispatch
from app.infra.keys import recipient_hash
from app.infra.parse_budget import parse_on_budget
from app.infra.redis import client_for, is_redis_url, redis_url
from app.observability.logs import warn_unreachable
from app.providers.base import ProviderMessage
from app.providers.runtime import provider_configs
from app.settings import Settings
from app.usecases import signals
from app.usecases.checks import CheckRunner
from app.usecases.checks.observed import Parser, record_messages, recorded_here

log = logging.getLogger("signalbox.sink")


class Received(NamedTuple):
    """One received message: MAIL FROM, envelope recipients, raw bytes, and
    the namespace whose API token its sender authenticated with (None: none)."""

    mail_from: str | None
    rcpts: Sequence[str]
    raw: bytes
    auth_namespace: str | None = None


class StoredMail(NamedTuple):
    """A message as stored: its sink id, its `msg_` id, when it was received."""

    sink_id: int
    message_id: str
    received_at: datetime


def store_many(settings: Settings, received: Sequence[Received]) -> list[StoredMail]:
    """Store messages raw (nothing is parsed) with their envelope recipients
    and their `msg_` ids, in one statement that is its own transaction:
    committed (durably, with PostgreSQL's synchronous commit) when it
    returns, in one round trip instead of three. Returns them, in order."""
    with autocommit() as session:
        stored = [StoredMail(*s) for s in sink_messages_db.sink_messages_store(session, received)]
    for (sink_id, message_id, _), (_, rcpts, raw, *_) in zip(stored, received, strict=True):
        log.info(
            "message received",
            extra={
                "event": "sink_received",
                "sink_message_id": sink_id,
                "message_id": message_id,
                "size": len(raw),
                "recipient_hashes": [
                    recipient_hash(r, settings) for r in sorted({r.lower() for r in rcpts})
                ],
            },
        )
    return stored


def inbox_provider(settings: Settings) -> str | None:
    """The sink-type provider whose name the sink's mail is recorded under
    for the inbox (`sink` unless the providers file names it otherwise)."""
    names = sorted(n for n, c in provider_configs(settings).items() if c.type == "sink")
    return "sink" if "sink" in names else (names[0] if names else None)


def record_stored(
    settings: Settings,
    stored: Sequence[StoredMail],
    received: Sequence[Received],
    parse: Parser = parse_on_budget,
) -> None:
    """Record stored messages in `messages` under their `msg_` ids, parsed:
    what the inbox lists and searches (and its events announce). A look that
    sees them later finds them recorded; one that recorded them here already
    (the push's, which this record waits for) leaves nothing to send."""
    provider = inbox_provider(settings)
    if provider is None or not stored:
        return
    pairs = [
        (s, r)
        for s, r in zip(stored, received, strict=True)
        if not recorded_here(provider, str(s.sink_id))
    ]
    if not pairs:
        return
    found = [
        ProviderMessage(
            provider_message_id=str(s.sink_id),
            received_at=s.received_at,
            raw=r[2],
            envelope_recipients=tuple(sorted({a.lower() for a in r[1]})),
            message_id=s.message_id,
            # The first to record a message decides who may see it.
            auth_namespace=r[3] if len(r) > 3 else None,
            # Stored a moment ago: recorded by no one when it was stored, so
            # its record is not asked for first (a look that recorded it
            # since is found by the insert, which then records nothing).
            recorded_known=True,
        )
        for s, r in pairs
    ]
    with transaction() as session:
        record_messages(session, provider, found, parse=parse)


def warm(settings: Settings) -> None:
    """Open the connections the first mail would otherwise wait for, before
    it arrives: one in each database pool (the store's and the push's, and
    the one a push's check writes its answer in), the breakers' Redis
    connection, and the broker's producer (the Celery import and broker
    connection alone took ~0.8 s; the check's pool and Redis 9 ms of the
    first push's 25). A failure here is only logged: the first message then
    connects, as before."""
    try:
        with autocommit() as session:  # the pool the store and the push use
            server_db.ping(session)
        with transaction() as session:  # the pool a check's answer is written in
            server_db.ping(session)
    except Exception as exc:
        warn_unreachable(
            log, "database not reachable at start", "sink_warm_failed", "database", exc
        )
    url = redis_url(settings)
    if is_redis_url(url):
        try:
            client_for(url).ping()  # the client the breakers use
        except Exception as exc:
            warn_unreachable(log, "Redis not reachable at start", "sink_warm_failed", "redis", exc)
    dispatch.warm()


def add_header_recipients(
    settings: Settings,
    sink_id: int,
    envelope_rcpts: Sequence[str],
    mail: ParsedMail,
    *,
    runner: CheckRunner | None = None,
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
            "recipient_hashes": [recipient_hash(r, settings) for r in extra],
        },
    )
    return _add_recipients(settings, sink_id, extra, runner)


# Stored messages whose envelope recipients' signals are to be pushed:
# (their sink ids, their envelope recipients).
Stored = tuple[Sequence[int], Sequence[str]]


def push_many(
    settings: Settings, stored: Sequence[Stored], *, runner: CheckRunner | None = None
) -> list[None]:
    """Push the signals of every envelope recipient of ``stored`` at once (the
    sink merges the pushes that wait while one runs). One None per item."""
    push(
        settings,
        [sink_id for ids, _ in stored for sink_id in ids],
        (r for _, rcpts in stored for r in rcpts),
        runner=runner,
    )
    return [None] * len(stored)


def add_header_block_recipients(
    settings: Settings,
    sink_id: int,
    envelope_rcpts: Sequence[str],
    head: bytes,
    *,
    runner: CheckRunner | None = None,
) -> list[str]:
    """As add_header_recipients, from the message's header block alone (the
    sink's way under load, when the message is not held for a parse)."""
    extra = sorted(set(header_block_recipients(head)) - {r.lower() for r in envelope_rcpts})
    return _add_recipients(settings, sink_id, extra, runner)


def _add_recipients(
    settings: Settings, sink_id: int, extra: list[str], runner: CheckRunner | None
) -> list[str]:
    """Add `extra` to the stored message's recipients and check their signals."""
    if not extra:
        return []
    with autocommit() as session:  # one statement: its own transaction
        sink_messages_db.sink_message_add_recipients(session, sink_id, extra)
    push(settings, [sink_id], extra, runner=runner)
    return extra


def needs_parse(raw: bytes, envelope_rcpts: Sequence[str]) -> bool:
    """Whether a stored message must be parsed for more recipients: not when
    its To and Cc plainly name only envelope recipients (the usual case), so
    no parse is spent on it."""
    return not header_recipients_within(raw, list(envelope_rcpts))


def push(
    settings: Settings,
    sink_ids: Sequence[int],
    recipients: Iterable[str],
    *,
    runner: CheckRunner | None = None,
) -> None:
    """Check the waiting signals of every sink-type provider for ``recipients``
    at once: by ``runner`` in this process when given, else by a task. Never
    raises: a lost push only means the signals find the stored message at
    their next scheduled check."""
    recipients = sorted({r.lower() for r in recipients})
    if not recipients:
        return
    for name, config in provider_configs(settings).items():
        if config.type != "sink":
            continue
        try:
            signals.push(name, recipients, runner=runner)
        except Exception as exc:
            log.warning(
                "push after receipt failed; signals will find the message at their next check",
                extra={
                    "event": "push_failed",
                    "sink_message_ids": list(sink_ids),
                    "provider": name,
                    "error": type(exc).__name__,
                },
            )
