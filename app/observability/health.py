"""Readiness: does each dependency answer right now?"""

from __future__ import annotations

import logging

import psycopg

from app.settings import Settings

log = logging.getLogger("signalbox.health")

TIMEOUT_SECONDS = 2


def database_ok(settings: Settings) -> bool:
    try:
        with psycopg.connect(
            settings.database_url or "", connect_timeout=TIMEOUT_SECONDS, autocommit=True
        ) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def broker_ok(settings: Settings) -> bool:
    from kombu import Connection

    try:
        with Connection(settings.broker_url, connect_timeout=TIMEOUT_SECONDS) as conn:
            conn.ensure_connection(max_retries=1, timeout=TIMEOUT_SECONDS)
        return True
    except Exception:  # any transport error means "not ready"
        return False


def failing_dependencies(settings: Settings) -> list[str]:
    failing = []
    if not database_ok(settings):
        failing.append("postgresql")
    if not broker_ok(settings):
        failing.append("broker")
    return failing
