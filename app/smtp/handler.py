"""The SMTP sink: an aiosmtpd handler that calls the intake use cases.

``250`` means the raw bytes are stored in PostgreSQL; the push to waiting
signals and the parsing happen after the answer (parsing in a worker process),
so neither a hostile message nor a slow broker delays the next message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session

from app import intake
from app.settings import Settings
from app.smtp.parsing import ParsePool

log = logging.getLogger("signalbox.smtp")

# Messages stored but not parsed yet, each held in memory (up to the size
# limit). Past this, a new message is still stored, answered and pushed, but
# not parsed: it keeps its envelope recipients (a flood cannot exhaust memory).
MAX_PENDING_PARSES = 64


class SinkHandler:
    """Accepts mail for the configured domains (any, if none are set);
    refuses other recipients with 550, and recipients past
    `SIGNALBOX_SMTP_MAX_RECIPIENTS` with 452. aiosmtpd itself answers 552 to
    mail over `SIGNALBOX_SMTP_MAX_BYTES`, and nothing of it is stored."""

    def __init__(self, settings: Settings, parser: ParsePool | None = None) -> None:
        self.settings = settings
        self.domains = settings.accepted_domains
        self.parser = parser or ParsePool()
        # Stores have threads of their own: a slow broker holding every push
        # thread must never delay the next message's 250.
        self._store_threads = ThreadPoolExecutor(8, thread_name_prefix="sink-store")
        self._after_threads = ThreadPoolExecutor(4, thread_name_prefix="sink-after")
        # Parses in flight; kept referenced so none is garbage-collected midway.
        self.pending: set[asyncio.Task[None]] = set()

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if len(envelope.rcpt_tos) >= self.settings.smtp_max_recipients:
            return "452 4.5.3 Too many recipients"
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
        data = bytes(raw)
        rcpts = list(envelope.rcpt_tos)
        try:
            sink_id = await asyncio.get_running_loop().run_in_executor(
                self._store_threads, intake.store, self.settings, envelope.mail_from, rcpts, data
            )
        except Exception:
            log.exception("message could not be stored", extra={"event": "sink_store_failed"})
            return "451 4.3.0 Temporary failure storing the message; try again"
        parse = sum(1 for t in self.pending if not t.done()) < MAX_PENDING_PARSES
        task = asyncio.get_running_loop().create_task(
            self._parse_later(sink_id, rcpts, data if parse else None)
        )
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return f"250 OK queued as {sink_id}"

    async def _parse_later(self, sink_id: int, rcpts: Sequence[str], raw: bytes | None) -> None:
        """After the answer: push the envelope recipients' signals, parse, then add
        the To/Cc recipients to the stored row (and push theirs)."""
        loop = asyncio.get_running_loop()
        try:
            needs_parse = await loop.run_in_executor(
                self._after_threads, intake.push_then_triage, self.settings, sink_id, rcpts, raw
            )
            if not needs_parse:
                return
            if raw is None:
                log.warning(
                    "too many messages waiting to be parsed; "
                    "this one keeps its envelope recipients",
                    extra={"event": "sink_parse_skipped", "sink_message_id": sink_id},
                )
                return
            mail = await self.parser.parse(raw)
            if mail is None:
                return
            await loop.run_in_executor(
                self._after_threads,
                intake.add_header_recipients,
                self.settings,
                sink_id,
                rcpts,
                mail,
            )
        except Exception as exc:  # the message is stored; its envelope recipients stand
            log.warning(
                "header recipients of a stored message could not be added",
                extra={
                    "event": "sink_parse_failed",
                    "sink_message_id": sink_id,
                    "error": type(exc).__name__,
                },
            )

    def close(self) -> None:
        self.parser.close()
        self._after_threads.shutdown(wait=False, cancel_futures=True)
        self._store_threads.shutdown(wait=False)
