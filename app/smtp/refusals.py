"""The sink's note of each refused delivery: counted at once
(`signalbox_smtp_refused_total{reason}`), and recorded in PostgreSQL off the
SMTP path (`app.usecases.refusals`), the ones refused meanwhile in one
statement. A flood of refusals cannot exhaust memory: past MAX_PENDING
waiting to be recorded, a refusal is only counted and logged."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from app.domain.refusals import RefusalReason
from app.observability import metrics
from app.settings import Settings
from app.smtp.batching import GroupCommit
from app.usecases import refusals

log = logging.getLogger("signalbox.smtp")

MAX_PENDING = 1000


def reply_code(reply: str) -> int:
    """The code of an SMTP reply line (0 when it has none)."""
    head = reply.strip()[:3]
    return int(head) if head.isdigit() else 0


def reply_text(reply: str) -> str:
    """The text of a reply after its code and enhanced status code."""
    parts = reply.strip().split(" ", 2)
    if parts and parts[0].isdigit():
        parts = parts[1:]
    if parts and parts[0][:1].isdigit() and parts[0].count(".") == 2:
        parts = parts[1:]
    return " ".join(parts)


class RefusalLog:
    """Counts and records the sink's refusals; used on its event loop."""

    def __init__(self, settings: Settings) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="sink-refusals")
        self._records: GroupCommit[dict[str, Any], None] = GroupCommit(
            partial(refusals.record_many, settings),
            self._thread,
            size_of=lambda _: 1,
            max_items=256,
        )
        self.pending: set[asyncio.Task[None]] = set()

    def note(
        self,
        reply: str,
        reason: RefusalReason,
        recipients: Sequence[str] = (),
        auth_namespace: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Count one refusal answered with `reply`, and record it (a TLS hello
        on the plain port has no recipient: it is counted only)."""
        metrics.smtp_refused(reason.value)
        if reason is RefusalReason.TLS_ON_PLAIN_PORT:
            return
        if len(self.pending) >= MAX_PENDING:
            log.warning(
                "too many refusals waiting to be recorded; this one is counted only",
                extra={"event": "smtp_refusal_skipped", "reason": reason.value},
            )
            return
        item = refusals.refusal_item(
            reply_code(reply),
            reason.value,
            reply_text(reply) if detail is None else detail,
            recipients,
            auth_namespace,
        )
        task = asyncio.get_running_loop().create_task(self._record(item))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _record(self, item: dict[str, Any]) -> None:
        try:
            await self._records.submit(item)
        except Exception as exc:  # the client has its answer; only the diagnosis is lost
            log.warning(
                "a refused delivery could not be recorded",
                extra={"event": "smtp_refusal_record_failed", "error": type(exc).__name__},
            )

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
