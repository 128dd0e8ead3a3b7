"""The check lease's heartbeat while the provider is asked."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from app.db import checks as checks_db
from app.db.engine import transaction

log = logging.getLogger("signalbox.checks")


class LeaseKeeper:
    """Heartbeat the check lease of the taken signals while the provider is
    asked, so a call slower than the lease still counts (and no other worker
    takes the signals meanwhile). A worker that dies stops beating: its
    lease lapses and the sweep sends the check again."""

    def __init__(self, fences: Sequence[tuple[str, int]], lease_seconds: float) -> None:
        self.fences = list(fences)
        self.lease = lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="check-lease", daemon=True)
        # Renewed with the lease while set (the provider call's bulkhead slot).
        self.also_renew: Callable[[], None] | None = None

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                also_renew = self.also_renew
                if also_renew is not None:
                    also_renew()
                with transaction() as session:
                    checks_db.signal_extend_check_leases(session, self.fences, self.lease)
            except Exception as exc:  # the next beat may succeed; the lease is the backstop
                log.warning(
                    "could not extend a check lease",
                    extra={"event": "check_lease_heartbeat_failed", "error": type(exc).__name__},
                )
