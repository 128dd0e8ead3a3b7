"""Client CPU per unit of work: an ORM Session against the Core connection.

What `app/db/engine.py`'s `autocommit()` and `transaction()` cost the calling
process around one short statement (run by `app/db/runner.py`, as the hot paths
run theirs), on an embedded PostgreSQL of its own:

- `session autocommit` / `session transaction`: an ORM `Session` on the
  same engine (what the two yielded before 2026-12-02);
- `core autocommit` / `core transaction`: `app.db.engine.autocommit()` and
  `transaction()` as they are now;
- `bare psycopg`: the statement on one psycopg connection, no pool: the floor.

Each variant runs `--count` times after 200 warm-up calls, interleaved
`--rounds` times; the figure is the median round's CPU per call of this
process (user + system). PostgreSQL's own CPU is not counted.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _machine
from floor import _Postgres


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def variants(url: str) -> tuple[dict[str, Callable[[], Any]], Callable[[], None]]:
    import psycopg
    from psycopg.rows import dict_row
    from sqlalchemy.orm import Session, sessionmaker

    from app.db import runner
    from app.db.engine import autocommit, make_engine, transaction
    from app.settings import to_sqlalchemy_url

    engine = make_engine(to_sqlalchemy_url(url))
    sessions = sessionmaker(bind=engine, expire_on_commit=False)
    autocommit_sessions = sessionmaker(
        bind=engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False
    )
    query = runner.Statement("bench_unit_of_work", "SELECT CAST(:a AS int) AS a, now() AS n")
    bare = psycopg.connect(url, autocommit=True)

    @contextmanager
    def in_session(factory: sessionmaker[Session], begin: bool) -> Any:
        with factory() as session:
            if begin:
                with session.begin():
                    yield session.connection()
            else:
                yield session.connection()

    def session_autocommit() -> Any:
        with in_session(autocommit_sessions, begin=False) as connection:
            return runner.one(connection, query, {"a": 1})

    def session_transaction() -> Any:
        with in_session(sessions, begin=True) as connection:
            return runner.one(connection, query, {"a": 1})

    def core_autocommit() -> Any:
        with autocommit(engine) as connection:
            return runner.one(connection, query, {"a": 1})

    def core_transaction() -> Any:
        with transaction(engine) as connection:
            return runner.one(connection, query, {"a": 1})

    def bare_psycopg() -> Any:
        with bare.cursor(row_factory=dict_row) as cursor:
            cursor.execute(query.psycopg_sql, {"a": 1})
            return cursor.fetchone()

    def close() -> None:
        bare.close()
        engine.dispose()

    return {
        "session autocommit": session_autocommit,
        "core autocommit": core_autocommit,
        "session transaction": session_transaction,
        "core transaction": core_transaction,
        "bare psycopg": bare_psycopg,
    }, close


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3000, help="calls per round (3000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="signalbox-uow-") as tmp:
        pg = _Postgres(Path(tmp))
        try:
            url = pg.database_url()
            calls, close = variants(url)
            per_call: dict[str, list[float]] = {name: [] for name in calls}
            for call in calls.values():
                for _ in range(200):
                    call()
            for _ in range(args.rounds):
                for name, call in calls.items():
                    began = _cpu()
                    for _ in range(args.count):
                        call()
                    per_call[name].append((_cpu() - began) / args.count * 1e6)
            close()
            machine = _machine.render(_machine.describe(url, None))
        finally:
            pg.stop()
    print(f"client CPU per unit of work, one short statement, {args.count} calls x {args.rounds}")
    width = max(len(name) for name in per_call)
    for name, figures in per_call.items():
        rounds = ", ".join(f"{f:.0f}" for f in figures)
        print(f"  {name:<{width}}  {statistics.median(figures):6.0f} µs  (rounds: {rounds})")
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
