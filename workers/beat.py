"""Celery beat's scheduler, running the sweep in the beat process itself.

The sweep (expiry, lapsed leases, due and lost checks, unpublished dead
letters) must run when checks are backed up, which is exactly when a queue
shared with them would hold it back. Entries marked `run_in_beat` run here,
one at a time (beat's loop is single-threaded, so two never overlap), and
every other entry is sent to the workers as usual. Beat runs as exactly one
replica; a second one would only take `SKIP LOCKED` rows the first left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

log = logging.getLogger("signalbox.beat")


def _sweep() -> Any:
    from app.settings import get_settings
    from app.usecases import sweep
    from workers.composition import sweep_runner

    return sweep.sweep(get_settings(), runner=sweep_runner())


def _heartbeat() -> None:
    from app.observability import heartbeat
    from app.settings import get_settings

    heartbeat.touch(get_settings().data_dir, "beat")


# Task name → what beat runs itself for it.
LOCAL: dict[str, Callable[[], Any]] = {"signalbox.sweep": _sweep}


class SignalboxScheduler(PersistentScheduler):  # type: ignore[misc]  # celery is untyped
    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        run = LOCAL.get(entry.task) if entry.options.get("run_in_beat") else None
        if run is None:
            super().apply_entry(entry, producer=producer)
            return
        began = time.monotonic()
        _heartbeat()  # beat's loop is alive: what its liveness probe asks
        try:
            run()
        except Exception as exc:  # the next tick tries again; beat must go on
            log.warning(
                "in-beat task failed",
                extra={
                    "event": "beat_task_failed",
                    "task": entry.task,
                    "error": type(exc).__name__,
                },
            )
        elapsed = time.monotonic() - began
        if elapsed > 5:
            log.warning(
                "in-beat task was slow",
                extra={"event": "beat_task_slow", "task": entry.task, "seconds": round(elapsed, 1)},
            )
