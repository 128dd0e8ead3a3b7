"""The database refuses a value its enumerated columns do not know (migration
0009), the migration applies to a database holding rows, and it downgrades."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest

from app.db.migrate import alembic_config, upgrade
from app.db.models import ENUMERATED, OTHER_CHECKS
from tests.stack_fixtures import PgServer, _libpq

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_database(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_empty_database(f"sbx_states_{os.getpid()}")
    yield url
    pg_server.drop_database(url)


def _signal(conn: psycopg.Connection, signal_id: str, status: str = "waiting") -> None:
    conn.execute(
        "INSERT INTO signals (id, namespace, idempotency_key, run_id, test_case,"
        " recipient, received_after, expires_at, max_checks, provider, status,"
        " max_claims, next_check_at)"
        " VALUES (%s, 'ns', %s, 'r', 't', 'x@example.test', now(),"
        " now() + interval '1 hour', 5, 'sink', %s, 3, now())",
        (signal_id, f"key-{signal_id}", status),
    )


def _rows_of_every_kind(conn: psycopg.Connection) -> None:
    """A row in every table with an enumerated column, with values the code writes."""
    _signal(conn, "sig_1", "expired")
    conn.execute(
        "UPDATE signals SET expiry_reason = 'deadline', next_check_reason = 'sweep',"
        " last_outcome = 'no_match' WHERE id = 'sig_1'"
    )
    conn.execute(
        "INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome, started_at)"
        " VALUES ('sig_1', 1, 1, 'sink', 'push', 'circuit_open', now())"
    )
    conn.execute(
        "INSERT INTO messages (id, provider, provider_message_id, received_at, recipients)"
        " VALUES ('msg_1', 'sink', '1', now(), ARRAY['x@example.test'])"
    )
    conn.execute(
        "INSERT INTO near_misses (signal_id, message_id, why)"
        " VALUES ('sig_1', 'msg_1', 'subject_mismatch')"
    )
    conn.execute(
        "INSERT INTO claims (id, signal_id, fence, run_id, message_id, state, lease_until)"
        " VALUES ('clm_1', 'sig_1', 1, 'r', 'msg_1', 'lapsed', now())"
    )
    conn.execute(
        "INSERT INTO dead_letters (id, signal_id, generation, namespace, run_id, provider,"
        " reason, state, checks_total, checks_by_outcome, near_misses, recommendation)"
        " VALUES ('dlq_1', 'sig_1', 1, 'ns', 'r', 'sink', 'check_budget', 'redriven', 1, '{}',"
        " '[]', 'x')"
    )
    conn.execute(
        "INSERT INTO webhook_deliveries (dead_letter_id, body, state)"
        " VALUES ('dlq_1', '{}', 'failed')"
    )


def _constraints(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute(
        "SELECT conname FROM pg_constraint WHERE contype = 'c' AND conname LIKE 'ck\\_%'"
    ).fetchall()
    return {name for (name,) in rows}


def test_an_unknown_signal_status_is_refused(empty_database: str) -> None:
    upgrade(empty_database)
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        _signal(conn, "sig_ok")
        with pytest.raises(psycopg.errors.CheckViolation, match="ck_signals_status"):
            _signal(conn, "sig_bad", "lost")
        with pytest.raises(psycopg.errors.CheckViolation, match="ck_signals_status"):
            conn.execute("UPDATE signals SET status = 'WAITING' WHERE id = 'sig_ok'")


def test_an_unknown_dead_letter_state_and_check_outcome_are_refused(empty_database: str) -> None:
    upgrade(empty_database)
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        _rows_of_every_kind(conn)
        with pytest.raises(psycopg.errors.CheckViolation, match="ck_dead_letters_state"):
            conn.execute("UPDATE dead_letters SET state = 'closed' WHERE id = 'dlq_1'")
        with pytest.raises(psycopg.errors.CheckViolation, match="ck_checks_outcome"):
            conn.execute(
                "INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,"
                " started_at) VALUES ('sig_1', 1, 2, 'sink', 'push', 'timeout', now())"
            )
        with pytest.raises(psycopg.errors.CheckViolation, match="ck_claims_state"):
            conn.execute("UPDATE claims SET state = 'expired' WHERE id = 'clm_1'")


def test_the_database_has_the_models_constraints(empty_database: str) -> None:
    upgrade(empty_database)
    with psycopg.connect(_libpq(empty_database)) as conn:
        assert _constraints(conn) == {f"ck_{t}_{c}" for t, c in ENUMERATED} | set(OTHER_CHECKS)


def test_the_migration_applies_to_rows_at_0008_and_downgrades(empty_database: str) -> None:
    from alembic import command

    upgrade(empty_database, "0008")
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        _rows_of_every_kind(conn)
    upgrade(empty_database)
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        assert len(_constraints(conn)) == len(ENUMERATED) + len(OTHER_CHECKS)
    command.downgrade(alembic_config(empty_database), "0008")
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        assert _constraints(conn) == set()
        _signal(conn, "sig_any", "lost")  # nothing refuses it below 0009
        conn.execute("DELETE FROM signals WHERE id = 'sig_any'")
    upgrade(empty_database)
    with psycopg.connect(_libpq(empty_database), autocommit=True) as conn:
        assert len(_constraints(conn)) == len(ENUMERATED) + len(OTHER_CHECKS)
