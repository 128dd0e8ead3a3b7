"""Readiness: does each dependency answer, and under `up`, does each part run?

`GET /readyz` answers 503 naming what fails and 200 as soon as it answers
again. The dependencies are PostgreSQL (through the process's connection
pool) and the broker (one kept connection). Under `signalbox-server up` the
API is told which other parts it runs with (SIGNALBOX_READY_PARTS) and also
checks them: the SMTP sink's port answers, the worker's and beat's heartbeat
files are fresh. The probes run side by side, each bounded by a timeout, and
their result is kept for about a second, so a probe storm (several load
balancers, a tight kubelet period) costs at most one probe round a second.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from app.observability import heartbeat
from app.settings import Settings
from app.usecases import readiness

log = logging.getLogger("signalbox.health")

TIMEOUT_SECONDS = 2.0
CACHE_SECONDS = 1.0
PARTS = ("smtp", "worker", "beat")


def database_ok(settings: Settings) -> bool:
    """PostgreSQL answers on a pooled connection and has a slot left for our role."""
    return readiness.database_answers(settings)


class _Broker:
    """One kept connection to the broker, reopened after a failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._url = ""
        self._client: Any = None

    def ok(self, url: str) -> bool:
        with self._lock:
            if url != self._url:
                self._close()
                self._url = url
            try:
                return self._probe(url)
            except Exception:  # any transport error means "not ready"
                self._close()
                return False

    def _probe(self, url: str) -> bool:
        if url.startswith(("redis://", "rediss://", "unix://")):
            import redis

            if self._client is None:
                self._client = redis.Redis.from_url(
                    url,
                    socket_timeout=TIMEOUT_SECONDS,
                    socket_connect_timeout=TIMEOUT_SECONDS,
                )
            return bool(self._client.ping())
        from kombu import Connection

        if self._client is None:
            self._client = Connection(url, connect_timeout=TIMEOUT_SECONDS, heartbeat=0)
        conn = self._client
        conn.ensure_connection(max_retries=1, timeout=TIMEOUT_SECONDS)
        # A round trip on the kept channel: a passive declare of an exchange
        # every AMQP broker has.
        conn.default_channel.exchange_declare(exchange="amq.direct", type="direct", passive=True)
        return True

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            client.close()
        except Exception:  # closing a broken connection is best effort
            log.debug("broker probe connection close failed", exc_info=True)


_broker = _Broker()


def broker_ok(settings: Settings) -> bool:
    url = settings.broker_url or ""
    return bool(url) and _broker.ok(url)


def smtp_ok(settings: Settings) -> bool:
    """The SMTP sink greets (220) on its port: the process answers, not just the kernel."""
    host = settings.smtp_host
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, settings.smtp_port), timeout=TIMEOUT_SECONDS) as conn:
            greeting = conn.recv(512)
            conn.sendall(b"QUIT\r\n")
            return greeting.startswith(b"220")
    except OSError:
        return False


def worker_ok(settings: Settings) -> bool:
    return heartbeat.alive(settings.data_dir, "worker", settings.sweep_interval_seconds)


def beat_ok(settings: Settings) -> bool:
    return heartbeat.alive(settings.data_dir, "beat", settings.sweep_interval_seconds)


DEPENDENCIES: dict[str, Callable[[Settings], bool]] = {
    "postgresql": database_ok,
    "broker": broker_ok,
}
PART_PROBES: dict[str, Callable[[Settings], bool]] = {
    "smtp": smtp_ok,
    "worker": worker_ok,
    "beat": beat_ok,
}


def probes_for(settings: Settings) -> dict[str, Callable[[Settings], bool]]:
    parts = [p.strip() for p in settings.ready_parts.split(",") if p.strip() in PART_PROBES]
    return {**DEPENDENCIES, **{p: PART_PROBES[p] for p in parts}}


_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="readyz")
_cache_lock = threading.Lock()
_cache: tuple[float, int, list[str]] | None = None


def _probe_all(settings: Settings) -> list[str]:
    probes = probes_for(settings)
    futures = {name: _pool.submit(probe, settings) for name, probe in probes.items()}
    deadline = time.monotonic() + 2 * TIMEOUT_SECONDS + 1
    failing = []
    for name, future in futures.items():
        try:
            ok = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            ok = False
        if not ok:
            failing.append(name)
    return failing


def failing_dependencies(settings: Settings) -> list[str]:
    """The names of what does not answer, in a stable order (cached ~1 s)."""
    global _cache
    with _cache_lock:
        now = time.monotonic()
        if _cache is not None and _cache[1] == id(settings) and now - _cache[0] < CACHE_SECONDS:
            return list(_cache[2])
        failing = _probe_all(settings)
        _cache = (time.monotonic(), id(settings), failing)
    if failing:
        log.warning(
            "not ready",
            extra={"event": "readiness_failed", "state": ",".join(failing)},
        )
    return list(failing)
