"""Readiness: does each dependency answer right now?

`GET /readyz` answers 503 naming what fails (`postgresql`, `broker`) and
200 as soon as it answers again: nothing is cached, each probe opens a fresh
connection with a short timeout, and the probes run side by side so a
down dependency costs one timeout, not one per dependency.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import psycopg

from app.settings import Settings

log = logging.getLogger("signalbox.health")

TIMEOUT_SECONDS = 2


def _libpq_url(url: str) -> str:
    # psycopg takes postgresql:// URLs; settings may name the SQLAlchemy driver.
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def database_ok(settings: Settings) -> bool:
    """PostgreSQL accepts a connection and answers a query."""
    try:
        url = _libpq_url(settings.database_url or "")
        with psycopg.connect(url, connect_timeout=TIMEOUT_SECONDS, autocommit=True) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def broker_ok(settings: Settings) -> bool:
    """The broker accepts a connection (a PING for Redis, a kombu connect otherwise)."""
    url = settings.broker_url or ""
    if not url:
        return False
    if url.startswith(("redis://", "rediss://", "unix://")):
        import redis

        client = redis.Redis.from_url(
            url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS
        )
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=TIMEOUT_SECONDS) as conn:
            conn.ensure_connection(max_retries=1, timeout=TIMEOUT_SECONDS)
        return True
    except Exception:  # any transport error means "not ready"
        return False


PROBES = {"postgresql": database_ok, "broker": broker_ok}


def failing_dependencies(settings: Settings) -> list[str]:
    """The names of the dependencies that do not answer, in a stable order."""
    with ThreadPoolExecutor(max_workers=len(PROBES), thread_name_prefix="readyz") as pool:
        results = {name: pool.submit(probe, settings) for name, probe in PROBES.items()}
        failing = [name for name, future in results.items() if not future.result()]
    if failing:
        log.warning(
            "not ready",
            extra={"event": "readiness_failed", "state": ",".join(failing)},
        )
    return failing
