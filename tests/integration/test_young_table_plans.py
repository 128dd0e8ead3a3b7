"""A fresh database's hot statements are not planned as empty for long.

A statement prepared on a young `signals` and planned once for all parameters
(PostgreSQL's generic plan, after five runs) scans the table; that plan stays
on its connection until the next `ANALYZE` of the table, which autovacuum
makes within a minute at best. The sweep analyzes a hot table that changed
by its own size since its statistics: the plan is made again, by the key.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from app.db import statistics
from app.db.engine import autocommit
from app.db.takes import _FIRST_LOOK_EMPTY
from app.settings import get_settings
from app.usecases import sweep
from tests.integration.looks import sql

pytestmark = pytest.mark.integration

_INSERT_WAITING = """
    INSERT INTO signals (id, idempotency_key, namespace, run_id, test_case, recipient,
                         received_after, created_at, updated_at, expires_at, max_checks,
                         provider, next_check_at)
    SELECT 'sig_' || md5(random()::text), md5(random()::text), 'default', 'young', 'case',
           md5(random()::text) || '@young.test', now(), now(), now(),
           now() + interval '1 hour', 10, 'sink', now() - interval '1 second'
      FROM generate_series(1, %s)
"""


@dataclass
class Prepared:
    conn: psycopg.Connection
    names: list[str]  # its parameters, in the order of $1, $2, ...


@pytest.fixture
def first_look(in_process: None) -> Iterator[Prepared]:
    """A connection holding the first look's statement prepared (`fl`) and
    run until PostgreSQL planned it generically, while `signals` held 20 rows."""
    with psycopg.connect(str(get_settings().database_url), autocommit=True) as conn:
        conn.execute(_INSERT_WAITING, (20,))
        names: list[str] = []

        def positional(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        sql = re.sub(r"(?<![:\w]):([a-z_]+)", positional, _FIRST_LOOK_EMPTY.sql)
        conn.execute("PREPARE fl AS " + sql)
        for _ in range(8):
            conn.execute(f"EXECUTE fl({_args(names)})")
        yield Prepared(conn, names)


def _args(names: list[str]) -> str:
    values = {
        "id": "'sig_none'",
        "fence": "0",
        "lookback": "600",
        "inc": "1",
        "next_at": "now() + interval '1 hour'",
        "next_reason": "'deadline'",
        "batch": "'chk_young'",
        "counted": "true",
    }
    return ", ".join(values[name] for name in names)


def _taken_scan(prepared: Prepared) -> str:
    """How the plan of `fl` finds the signal it takes."""
    explain = f"EXPLAIN EXECUTE fl({_args(prepared.names)})"
    plan = "\n".join(str(row[0]) for row in prepared.conn.execute(explain))
    scans = re.findall(r"(\w[\w ]*Scan(?: using \w+)? on signals s)\b", plan)
    assert scans, plan
    return scans[0]


def _grow(rows: int) -> None:
    """Insert `rows` waiting signals (`sql`: a session of its own, closed, so
    its backend reports them), and wait until the server's statistics count them."""
    sql(_INSERT_WAITING, rows)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ((changed,),) = sql(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'signals'"
        )
        if changed >= rows:
            return
        time.sleep(0.05)
    raise AssertionError("the server's statistics never counted the inserted rows")


def test_the_sweep_replans_a_statement_planned_while_the_table_was_young(
    first_look: Prepared,
) -> None:
    _grow(5000)
    # The failure mode itself: planned as young, the look reads the table.
    assert "pk_signals" not in _taken_scan(first_look)

    sweep.sweep(get_settings())

    assert _taken_scan(first_look) == "Index Scan using pk_signals on signals s"


def test_only_tables_grown_by_their_own_size_are_analyzed(in_process: None) -> None:
    _grow(3000)
    with autocommit() as session:
        assert "signals" in statistics.analyze_grown(session)
        # Analyzed now: nothing has changed since.
        assert statistics.analyze_grown(session) == []
    # A tenth more is autovacuum's to see, not the sweep's.
    _grow(300)
    with autocommit() as session:
        assert statistics.analyze_grown(session) == []
