"""The check lease's heartbeat while the provider is asked.

One thread per process beats every lease kept in it (`_Beats`), started
with the first: a check starts no thread of its own, which cost more than
the sink's whole search. A check that ends before a third of its lease
(nearly all of them) is never beaten at all.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from app.db import takes as takes_db
from app.db.engine import transaction

log = logging.getLogger("signalbox.checks")


class LeaseKeeper:
    """Heartbeat the check lease of the taken signals while the provider is
    asked, so a call slower than the lease still counts (and no other worker
    takes the signals meanwhile). A worker that dies stops beating: its
    lease lapses and the sweep sends the check again. Once the keeper is
    left, no beat of it is in flight and none follows (a late one would
    lease again a signal whose check is written)."""

    def __init__(self, fences: Sequence[tuple[str, int]], lease_seconds: float) -> None:
        self.fences = list(fences)
        self.lease = lease_seconds
        # Held while a beat runs: leaving waits for it.
        self._beating = threading.Lock()
        self._left = False
        # Renewed with the lease while set (the provider call's bulkhead slot).
        self.also_renew: Callable[[], None] | None = None

    def __enter__(self) -> LeaseKeeper:
        _BEATS.add(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _BEATS.remove(self)
        with self._beating:  # a beat in flight ends first; none starts after
            self._left = True

    @property
    def interval(self) -> float:
        return self.lease / 3

    def beat(self) -> None:
        """Extend the lease (and `also_renew`) once, unless the keeper was left."""
        with self._beating:
            if self._left:
                return
            try:
                also_renew = self.also_renew
                if also_renew is not None:
                    also_renew()
                with transaction() as session:
                    takes_db.signal_extend_check_leases(session, self.fences, self.lease)
            except Exception as exc:  # the next beat may succeed; the lease is the backstop
                log.warning(
                    "could not extend a check lease",
                    extra={"event": "check_lease_heartbeat_failed", "error": type(exc).__name__},
                )


class _Beats:
    """The process's one heartbeat thread: each keeper is beaten every
    `interval` from when it was entered, until it is left. Beats run one
    after another (a process holds few checks at once; a beat is one short
    statement, bounded by the session's statement timeout)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # A forked child (a Celery pool process) has no thread: it starts its own.
        self._cond = threading.Condition()
        self._due: dict[LeaseKeeper, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            self._due[keeper] = time.monotonic() + keeper.interval
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="check-lease", daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            self._due.pop(keeper, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [k for k, at in self._due.items() if at <= now]
                if not due:
                    wait = min(self._due.values()) - now if self._due else None
                    self._cond.wait(wait)
                    continue
                for keeper in due:
                    self._due[keeper] = now + keeper.interval
            for keeper in due:
                keeper.beat()


_BEATS = _Beats()
