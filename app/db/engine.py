"""Engine and units of work (Core connections). One engine per process, created
lazily from settings. Code that takes a unit's connection names it `session`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from app.settings import Settings, get_settings, to_sqlalchemy_url

_lock = threading.Lock()
_engines: dict[tuple[int, str], Engine] = {}


# A pooled connection idle longer than this is pinged before it is handed out.
PING_AFTER_IDLE_SECONDS = 1.0


def make_engine(
    url: str, *, pool_size: int = 10, statement_timeout_ms: int = 0, lock_timeout_ms: int = 0
) -> Engine:
    """An engine whose connections never wait unbounded: `statement_timeout` and
    `lock_timeout` (milliseconds, 0 = none) are set on every connection.

    A connection is pinged at checkout only when it sat in the pool longer
    than `PING_AFTER_IDLE_SECONDS` (SQLAlchemy's `pool_pre_ping` pings every
    checkout: a round trip per transaction, ~7 per lifecycle). One that fails
    the ping is replaced. A connection in steady use is not pinged: after a
    PostgreSQL restart the first statement on it fails, as one in flight
    during the restart would, and that failure invalidates the whole pool,
    so every other connection is replaced at its next checkout."""
    options = (
        f"-c statement_timeout={int(statement_timeout_ms)} -c lock_timeout={int(lock_timeout_ms)}"
    )
    engine = create_engine(
        to_sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=20,
        connect_args={"options": options, "connect_timeout": 10},
    )
    _ping_after_idle(engine)
    return engine


def _ping_after_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _idle_from(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(
        dbapi_connection: Any, record: ConnectionPoolEntry, proxy: PoolProxiedConnection
    ) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since <= PING_AFTER_IDLE_SECONDS:
            return  # new, or in steady use
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as error:
            # The pool discards this connection and checks out another
            # (SQLAlchemy's documented pessimistic disconnect handling).
            raise exc.DisconnectionError() from error


def get_engine(settings: Settings | None = None) -> Engine:
    """The process's engine. Keyed by pid so a forked Celery child never
    reuses its parent's connections."""
    settings = settings or get_settings()
    key = (os.getpid(), settings.sqlalchemy_url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = make_engine(
                settings.sqlalchemy_url,
                statement_timeout_ms=settings.db_statement_timeout_ms,
                lock_timeout_ms=settings.db_lock_timeout_ms,
            )
            _engines[key] = engine
        return engine


def dispose_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=False)
        _engines.clear()
        _autocommit.clear()


@contextmanager
def transaction(engine: Engine | None = None) -> Iterator[Connection]:
    """One unit of work on one connection: commit on success, roll back on
    any exception. A Core `Connection`, not an ORM `Session`: the code runs
    SQL text only, and a session's unit-of-work bookkeeping cost about as
    much CPU per transaction as the statements themselves
    (bench/units_of_work.py)."""
    with (engine or get_engine()).begin() as connection:
        yield connection


_autocommit: dict[Engine, Engine] = {}


@contextmanager
def autocommit(engine: Engine | None = None) -> Iterator[Connection]:
    """Statements outside a transaction: each runs and commits on its own,
    without the BEGIN and COMMIT round trips of :func:`transaction`. For
    reads (under READ COMMITTED every statement of a transaction takes its
    own snapshot anyway) and for a unit of work that is one statement."""
    engine = engine or get_engine()
    autocommit = _autocommit.get(engine)
    if autocommit is None:
        with _lock:  # shares the engine's pool; the option is set per checkout
            autocommit = _autocommit.setdefault(
                engine, engine.execution_options(isolation_level="AUTOCOMMIT")
            )
    with autocommit.connect() as connection:
        yield connection


def retryable(error: exc.OperationalError) -> bool:
    """PostgreSQL aborted the statement to break a deadlock or a conflict,
    or it waited on a lock past `lock_timeout`: it wrote nothing, and the
    same work may be tried again."""
    return isinstance(
        getattr(error, "orig", None),
        psycopg.errors.DeadlockDetected
        | psycopg.errors.SerializationFailure
        | psycopg.errors.LockNotAvailable,
    )
