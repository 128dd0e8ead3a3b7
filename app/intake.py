"""Use case of the SMTP sink: store a received message, then push."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from app import signals
from app.db import messages as messages_repo
from app.db.engine import transaction
from app.domain.ids import recipient_hash
from app.domain.mail import parse_mail
from app.providers.runtime import provider_configs
from app.settings import Settings

log = logging.getLogger("signalbox.sink")


def receive(
    settings: Settings, mail_from: str | None, envelope_rcpts: Sequence[str], raw: bytes
) -> int:
    """Store one message as received (malformed MIME is stored raw: matching
    uses what could be decoded) and check the waiting signals of every
    sink-type provider for its recipients at once. Returns the sink id."""
    parsed = parse_mail(raw)
    envelope = [r.lower() for r in envelope_rcpts]
    everyone = sorted({*envelope, *parsed.to, *parsed.cc})
    with transaction() as session:
        sink_id, _ = messages_repo.sink_message_store(
            session,
            mail_from=mail_from,
            envelope_recipients=envelope,
            all_recipients=everyone,
            raw=raw,
        )
    log.info(
        "message received",
        extra={
            "event": "sink_received",
            "sink_message_id": sink_id,
            "size": len(raw),
            "recipient_hashes": [recipient_hash(r) for r in envelope],
            "defects": len(parsed.defects),
        },
    )
    # The message is stored: from here on a failure must not turn into an
    # SMTP error (the client would send it again). A lost push only means the
    # signals find it at their next scheduled check.
    for name, config in provider_configs(settings).items():
        if config.type != "sink":
            continue
        try:
            signals.push(name, everyone)
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
    return sink_id
