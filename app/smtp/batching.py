"""Group commit for the SMTP sink: one transaction for the messages that
arrive while the previous one commits.

``250`` still means "stored in PostgreSQL": :meth:`GroupCommit.submit` returns
only once its item's transaction has committed. While a commit is in flight
the items of every other session queue up; the next transaction takes them
all (up to ``max_items`` and ``max_bytes``), so under load one commit serves
many messages and with a single client nothing waits for a batch to fill.

When a batch fails on something one item could cause (``split_on``), it
is tried again item by item, so one message the database refuses gets its
own error and the others are stored. A failure of the database itself
(unreachable, timed out) fails the whole batch at once: trying each item
again would only multiply the wait before every session hears 451.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger("signalbox.smtp")

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class _Pending(Generic[T, R]):
    item: T
    size: int
    done: asyncio.Future[R] = field(repr=False)


class GroupCommit(Generic[T, R]):
    """Runs ``store_many(items) -> results`` (one result per item, in order) in
    ``executor``, one call at a time, over whatever has queued meanwhile.
    ``on_stored(items, results)`` is called on the event loop after each
    successful call (the items' futures are already resolved); a failed batch
    is tried again item by item when ``split_on(error)``."""

    def __init__(
        self,
        store_many: Callable[[Sequence[T]], Sequence[R]],
        executor: Executor,
        *,
        size_of: Callable[[T], int],
        max_items: int = 64,
        max_bytes: int = 8 * 1024 * 1024,
        on_stored: Callable[[Sequence[T], Sequence[R]], None] | None = None,
        split_on: Callable[[Exception], bool] = lambda exc: True,
    ) -> None:
        self._store_many = store_many
        self._executor = executor
        self._size_of = size_of
        self.max_items = max(1, max_items)
        self.max_bytes = max_bytes
        self._on_stored = on_stored
        self._split_on = split_on
        self._queue: list[_Pending[T, R]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """Store ``item`` with whatever else is waiting; its result once committed."""
        loop = asyncio.get_running_loop()
        pending: _Pending[T, R] = _Pending(item, self._size_of(item), loop.create_future())
        self._queue.append(pending)
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run())
        return await asyncio.shield(pending.done)

    def _next_batch(self) -> list[_Pending[T, R]]:
        """The oldest waiting items within the caps (at least one)."""
        taken, size = 0, 0
        for pending in self._queue:
            if taken and (taken >= self.max_items or size + pending.size > self.max_bytes):
                break
            taken += 1
            size += pending.size
        batch, self._queue = self._queue[:taken], self._queue[taken:]
        return batch

    async def _run(self) -> None:
        while self._queue:
            batch = self._next_batch()
            try:
                await self._store(batch)
            except Exception:  # never leave a submitter waiting
                log.exception("group commit failed", extra={"event": "sink_store_failed"})
                for pending in batch:
                    if not pending.done.done():
                        pending.done.set_exception(RuntimeError("the store failed"))

    async def _store(self, batch: list[_Pending[T, R]]) -> None:
        loop = asyncio.get_running_loop()
        items = [p.item for p in batch]
        try:
            results = list(await loop.run_in_executor(self._executor, self._store_many, items))
        except Exception as exc:
            if len(batch) == 1 or not self._split_on(exc):
                for pending in batch:
                    pending.done.set_exception(exc)
                return
            # One refused item must not fail the others: each alone.
            for pending in batch:
                await self._store([pending])
            return
        if len(results) != len(batch):
            raise RuntimeError(f"store_many gave {len(results)} results for {len(batch)} items")
        for pending, result in zip(batch, results, strict=True):
            pending.done.set_result(result)
        if self._on_stored is not None:
            try:
                self._on_stored(items, results)
            except Exception:  # the items are stored and answered
                log.exception("after-store hook failed", extra={"event": "sink_after_failed"})
