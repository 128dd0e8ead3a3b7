"""The SMTP sink: an aiosmtpd handler that calls the intake use case."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from app import intake
from app.settings import Settings

log = logging.getLogger("signalbox.smtp")


class SinkHandler:
    """Accepts mail for the configured domains (any, if none are set);
    refuses other recipients with 550. aiosmtpd itself answers 552 to mail
    over `SIGNALBOX_SMTP_MAX_BYTES`, and nothing of it is stored."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.domains = settings.accepted_domains

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        domain = address.rpartition("@")[2].lower().rstrip(">")
        if not domain:
            return "553 5.1.3 Recipient address must be name@domain"
        if self.domains and domain not in self.domains:
            return "550 5.7.1 Recipient domain not accepted here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw: Any = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        if len(raw) > self.settings.smtp_max_bytes:
            return "552 5.3.4 Message too big"
        try:
            sink_id = await asyncio.get_running_loop().run_in_executor(
                None,
                intake.receive,
                self.settings,
                envelope.mail_from,
                list(envelope.rcpt_tos),
                bytes(raw),
            )
        except Exception:
            log.exception("message could not be stored", extra={"event": "sink_store_failed"})
            return "451 4.3.0 Temporary failure storing the message; try again"
        return f"250 OK queued as {sink_id}"
