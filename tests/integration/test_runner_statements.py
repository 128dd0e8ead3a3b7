"""Statements run by app.db.runner behave as SQLAlchemy's would in a session:
same transaction, SQLAlchemy's exceptions, and a lost connection
invalidates the pool. On a real PostgreSQL of the test's own."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from app.db import runner
from app.db.engine import autocommit, make_engine, transaction
from tests.stack_fixtures import conninfo_to_url

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(own_postgres: object) -> Iterator[Engine]:
    eng = make_engine(conninfo_to_url(own_postgres.get_uri()), pool_size=1)  # type: ignore[attr-defined]
    with transaction(eng) as s:
        s.execute(text("CREATE TABLE t (id int PRIMARY KEY, note text)"))
    yield eng
    eng.dispose()


INSERT = runner.Statement(
    "test_t_insert", "INSERT INTO t (id, note) VALUES (:id, :note) RETURNING id, note"
)
COUNT = runner.Statement("test_t_count", "SELECT count(*) AS n FROM t")


def test_a_raw_statement_is_part_of_the_sessions_transaction(engine: Engine) -> None:
    with pytest.raises(RuntimeError), transaction(engine) as s:
        assert runner.one(s, INSERT, {"id": 1, "note": "a"}) == {"id": 1, "note": "a"}
        s.execute(text("INSERT INTO t VALUES (2, 'b')"))
        raise RuntimeError("roll back")
    with autocommit(engine) as s:
        assert runner.one(s, COUNT, {}) == {"n": 0}  # both rolled back
    with transaction(engine) as s:
        runner.one(s, INSERT, {"id": 1, "note": "a"})
    with autocommit(engine) as s:
        assert runner.all(s, runner.variant("test_t_ids", "SELECT id FROM t"), {}) == [{"id": 1}]
        assert (
            runner.exec(
                s, runner.variant("test_t_note", "UPDATE t SET note = 'z' WHERE id < :n"), {"n": 5}
            )
            == 1
        )


def test_errors_are_sqlalchemys(engine: Engine) -> None:
    with transaction(engine) as s:
        runner.one(s, INSERT, {"id": 1, "note": "a"})
    with pytest.raises(IntegrityError), transaction(engine) as s:
        runner.one(s, INSERT, {"id": 1, "note": "again"})
    with pytest.raises(ProgrammingError), autocommit(engine) as s:
        runner.one(s, runner.variant("test_t_nope", "SELECT nope FROM t"), {})


def test_a_lost_connection_invalidates_the_pool(engine: Engine) -> None:
    with autocommit(engine) as s:
        pid = runner.one(s, runner.variant("test_t_pid", "SELECT pg_backend_pid() AS pid"), {})
    assert pid is not None
    with psycopg.connect(_url(engine), autocommit=True) as admin:  # ends the pooled one
        admin.execute("SELECT pg_terminate_backend(%s)", [pid["pid"]])
    with pytest.raises(OperationalError) as failed, autocommit(engine) as s:
        runner.one(s, COUNT, {})
    assert failed.value.connection_invalidated
    with autocommit(engine) as s:  # a fresh connection
        assert runner.one(s, COUNT, {}) == {"n": 0}


def _url(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


XACT = runner.Statement(
    "test_t_xact", "SELECT pg_current_xact_id_if_assigned()::text AS xact, count(*) AS n FROM t"
)


def test_statements_sent_together_are_one_transaction_on_an_autocommit_connection(
    engine: Engine,
) -> None:
    with autocommit(engine) as s:
        inserted, counted = runner.together(s, [(INSERT, {"id": 1, "note": "a"}), (XACT, {})])
        assert inserted == [{"id": 1, "note": "a"}]
        # The second saw the first's row, inside the first's transaction.
        assert counted[0]["n"] == 1 and counted[0]["xact"] is not None
        # Committed once at the end: a later statement is a new transaction.
        assert runner.one(s, XACT, {}) == {"xact": None, "n": 1}


def test_an_error_in_statements_sent_together_undoes_them_all(engine: Engine) -> None:
    with pytest.raises(IntegrityError), autocommit(engine) as s:
        runner.together(s, [(INSERT, {"id": 1, "note": "a"}), (INSERT, {"id": 1, "note": "again"})])
    with pytest.raises(ProgrammingError), autocommit(engine) as s:
        runner.together(
            s,
            [
                (INSERT, {"id": 2, "note": "b"}),
                (runner.variant("test_t_nope_alone", "SELECT nope"), {}),
            ],
        )
    with autocommit(engine) as s:  # nothing was written, and the connection still works
        assert runner.one(s, COUNT, {}) == {"n": 0}
        assert runner.together(s, [(COUNT, {}), (COUNT, {})]) == [[{"n": 0}], [{"n": 0}]]
