"""Engine and units of work (Core connections). One engine per process, created
lazily from settings. Code that takes a unit's connection names it `session`."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, ExceptionContext, create_engine, event, exc
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from app.settings import Settings, get_settings, to_sqlalchemy_url

_lock = threading.RLock()  # get_engine holds it while make_engine takes it
_engines: dict[tuple[int, str], Engine] = {}


# A pooled connection idle longer than this is pinged before it is handed out.
PING_AFTER_IDLE_SECONDS = 1.0
# The autocommit companion's pool: its units are one or two short statements,
# and most of a process's units are such (every read, create, claim, consume,
# first look). When an API process made a create's first look after the
# answer, each creating client kept two units in flight, and with 10 kept, 8
# clients made the pool open and close a backend every 9 creates (a new
# backend plans each statement on its first runs: 1.1 ms of PostgreSQL's
# 2.7 ms per create, bench/idle.py --pg-stat-statements). A create now makes
# its first look on its own connection: one unit per creating client, and
# 8 clients opened 2 sessions in 5,000 creates where they had opened 43.
# 16 are kept, headroom for the long polls' reads beside 8 creating
# clients; the bound stays 25. A pool opens connections only as its units
# need them, so a process keeps what its peak used, up to 16 (docs/deploy.md
# budgets them).
AUTOCOMMIT_POOL_SIZE = 16
AUTOCOMMIT_MAX_OVERFLOW = 9
# A connection PostgreSQL refused for want of slots (max_connections reached:
# "sorry, too many clients already") is tried again after these pauses
# (seconds, jittered): a burst elsewhere ends and frees one. Then the error
# goes up, and the API answers 503 with Retry-After (app/api/errors.py).
REFUSED_CONNECT_PAUSES = (0.05, 0.1, 0.2, 0.4)
_NO_SLOTS = ("too many clients", "too many connections", "remaining connection slots")
_autocommit: dict[Engine, Engine] = {}


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
    so every other connection is replaced at its next checkout.

    The engine comes with a companion for :func:`autocommit`, made here with
    the same options (see `_autocommit_companion`)."""
    options = (
        f"-c statement_timeout={int(statement_timeout_ms)} -c lock_timeout={int(lock_timeout_ms)}"
    )
    connect_args = {"options": options, "connect_timeout": 10}
    engine = create_engine(
        to_sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=20,
        connect_args=connect_args,
    )
    companion = create_engine(
        to_sqlalchemy_url(url),
        isolation_level="AUTOCOMMIT",
        # A connection that only ever runs in autocommit holds no transaction
        # to roll back when it is returned.
        pool_reset_on_return=None,
        pool_size=AUTOCOMMIT_POOL_SIZE,
        max_overflow=AUTOCOMMIT_MAX_OVERFLOW,
        connect_args=connect_args,
    )
    for one in (engine, companion):
        _ping_after_idle(one)
        _retry_refused_connects(one)
    _invalidate_together(engine, companion)

    @event.listens_for(engine, "engine_disposed")
    def _dispose_companion(disposed: Engine) -> None:
        with _lock:
            kept = _autocommit.get(disposed)
        if kept is not None:  # dispose_engines takes its companions out first
            kept.dispose()

    with _lock:
        _autocommit[engine] = companion
    return engine


def refused_for_slots(error: BaseException) -> bool:
    """PostgreSQL refused the connection because it has no slot free (SQLSTATE
    53300, which psycopg does not expose for a failed connect: its message)."""
    text = str(error).lower()
    return isinstance(error, psycopg.OperationalError) and any(s in text for s in _NO_SLOTS)


def _retry_refused_connects(engine: Engine) -> None:
    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        for pause in (*REFUSED_CONNECT_PAUSES, None):
            try:
                return dialect.connect(*cargs, **cparams)
            except psycopg.OperationalError as error:
                if pause is None or not refused_for_slots(error):
                    raise
                time.sleep(pause * (0.5 + random.random()))
        raise AssertionError("unreachable")


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
    """Forget every engine without closing its connections (a forked child
    must not close its parent's)."""
    with _lock:
        engines = [*_engines.values(), *_autocommit.values()]
        _engines.clear()
        _autocommit.clear()
    for engine in engines:
        engine.dispose(close=False)


@contextmanager
def transaction(engine: Engine | None = None) -> Iterator[Connection]:
    """One unit of work on one connection: commit on success, roll back on
    any exception. A Core `Connection`, not an ORM `Session`: the code runs
    SQL text only, and a session's unit-of-work bookkeeping cost about as
    much CPU per transaction as the statements themselves
    (bench/units_of_work.py)."""
    with (engine or get_engine()).begin() as connection:
        yield connection


@contextmanager
def autocommit(engine: Engine | None = None) -> Iterator[Connection]:
    """Statements outside a transaction: each runs and commits on its own,
    without the BEGIN and COMMIT round trips of :func:`transaction`. For
    reads (under READ COMMITTED every statement of a transaction takes its
    own snapshot anyway) and for a unit of work that is one statement."""
    with _autocommit_companion(engine or get_engine()).connect() as connection:
        yield connection


def _autocommit_companion(engine: Engine) -> Engine:
    """The engine :func:`autocommit` checks out from: a pool of its own whose
    connections stay in autocommit, so a checkout neither switches the
    connection's mode nor rolls it back when it comes back (40 of the 98 µs
    of client CPU an autocommit unit cost on the shared pool,
    bench/units_of_work.py). An engine not made by `make_engine` shares its
    pool, the mode set per checkout."""
    companion = _autocommit.get(engine)
    if companion is None:
        with _lock:
            companion = _autocommit.setdefault(
                engine, engine.execution_options(isolation_level="AUTOCOMMIT")
            )
    return companion


def _invalidate_together(engine: Engine, companion: Engine) -> None:
    """A disconnect seen on either engine's connections (PostgreSQL restarted)
    replaces the other's pool as well: its connections are as dead, and each
    would otherwise fail one statement before its pool noticed."""

    def replace(other: Engine) -> Callable[[ExceptionContext], None]:
        def handle_error(context: ExceptionContext) -> None:
            if context.is_disconnect and context.invalidate_pool_on_disconnect:
                other.dispose()  # its idle connections closed; those in use go with the old pool

        return handle_error

    event.listen(engine, "handle_error", replace(companion))
    event.listen(companion, "handle_error", replace(engine))


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
