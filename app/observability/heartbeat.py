"""Heartbeat files: a process proves that its main loop turns.

The worker's consumer touches `SIGNALBOX_DATA_DIR/heartbeats/worker-<pid>` at
each Celery event heartbeat (every 2 s, from the consumer's own event loop);
beat touches `beat-<pid>` each time it sends a task (every sweep interval).
A file whose time is older than a few intervals means the loop is stuck or
the process is gone. They serve the liveness probe of a pod
(`signalbox-server probe worker|beat`) and `/readyz` under `up`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HEARTBEAT_SUBDIR = "heartbeats"
# Celery's event heartbeat is every 2 s; beat sends a sweep every
# SIGNALBOX_SWEEP_INTERVAL_SECONDS (1 s).
WORKER_MAX_AGE_SECONDS = 10.0
BEAT_MIN_MAX_AGE_SECONDS = 10.0


def heartbeat_dir(data_dir: Path) -> Path:
    return Path(data_dir).absolute() / HEARTBEAT_SUBDIR


def touch(data_dir: Path, kind: str) -> None:
    """Record that this process of `kind` is alive now (best effort)."""
    from app.infra.embedded import private_dir

    path = heartbeat_dir(data_dir)
    try:
        # Private from creation (0700), the data dir too when missing: the
        # files (heartbeats, beat's schedule) are made with the umask's mode.
        private_dir(Path(data_dir), tighten=False)
        private_dir(path)
        (path / f"{kind}-{os.getpid()}").touch(mode=0o600)
    except OSError:
        pass  # a full or read-only disk must not stop the worker; the probe will say it


def newest_age(data_dir: Path, kind: str) -> float | None:
    """Seconds since the freshest heartbeat of any process of `kind`; None if none."""
    newest = None
    for file in heartbeat_dir(data_dir).glob(f"{kind}-*"):
        try:
            mtime = file.stat().st_mtime
        except OSError:
            continue
        newest = mtime if newest is None else max(newest, mtime)
    return None if newest is None else max(0.0, time.time() - newest)


def max_age(kind: str, sweep_interval_seconds: float) -> float:
    if kind == "beat":
        return max(BEAT_MIN_MAX_AGE_SECONDS, 5 * sweep_interval_seconds)
    return WORKER_MAX_AGE_SECONDS


def alive(data_dir: Path, kind: str, sweep_interval_seconds: float) -> bool:
    age = newest_age(data_dir, kind)
    return age is not None and age <= max_age(kind, sweep_interval_seconds)
