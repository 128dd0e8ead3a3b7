"""Retention's batch deletes with many signals waiting: one batch of each, timed.

On an embedded PostgreSQL of its own, migrated: `--waiting` waiting signals
and `--old` sink messages and observed messages past the retention horizon
(one in ten addressed to a waiting signal, which retention must keep). One
batch of `sink_message_delete_old` and of `message_delete_old` (the batch
size retention uses), each in a transaction rolled back afterwards, `--rounds`
times: the wall time and PostgreSQL's CPU of each batch (every server
process, from /proc), the rows it deleted, and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
from floor import _Postgres

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TICK = 0.01  # seconds per clock tick of /proc (USER_HZ 100)


def fill(url: str, waiting: int, old: int) -> None:
    import psycopg

    addresses = (
        "CASE WHEN g %% 10 = 0 THEN 'waiting-' || g || '@example.test'"
        " ELSE 'gone-' || g || '@example.test' END"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO signals (id, namespace, idempotency_key, run_id, test_case, recipient,"
            " received_after, expires_at, max_checks, provider, next_check_at)"
            " SELECT 'sig_r' || g, 'default', 'k' || g, 'run', 'case',"
            "        'Waiting-' || g || '@Example.test', now(), now() + interval '1 day', 10,"
            "        'sink', now() + interval '1 hour'"
            "   FROM generate_series(1, %s) g",
            (waiting,),
        )
        conn.execute(
            "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw,"
            f" received_at) SELECT 'app@example.test', ARRAY[{addresses}], ARRAY[{addresses}], 1,"
            "        'x'::bytea, now() - interval '100 hours' FROM generate_series(1, %s) g",
            (old,),
        )
        conn.execute(
            "INSERT INTO messages (id, provider, provider_message_id, received_at, observed_at,"
            f" recipients) SELECT 'msg_r' || g, 'sink', 'r' || g, now() - interval '100 hours',"
            f"        now() - interval '100 hours', ARRAY[{addresses}]"
            " FROM generate_series(1, %s) g",
            (old,),
        )
        conn.execute("VACUUM ANALYZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=20000, help="waiting signals (20000)")
    parser.add_argument("--old", type=int, default=2000, help="old rows of each kind (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="batches of each kind (3)")
    args = parser.parse_args()
    from app.db import retention as retention_db
    from app.db.engine import make_engine
    from app.db.migrate import upgrade
    from app.usecases.retention import BATCH_SIZE

    steps = {
        "sink_messages": retention_db.sink_message_delete_old,
        "messages": retention_db.message_delete_old,
    }
    figures: dict[str, list[tuple[float, float, int]]] = {name: [] for name in steps}
    with tempfile.TemporaryDirectory(prefix="signalbox-retention-") as tmp:
        pg = _Postgres(Path(tmp))
        try:
            url = pg.database_url()
            upgrade(url)
            fill(url, args.waiting, args.old)
            engine = make_engine(url, pool_size=1)
            for _ in range(args.rounds):
                for name, step in steps.items():
                    ticks, began = pg.server_ticks(), time.perf_counter()
                    with engine.connect() as session:  # begins at the first statement
                        deleted = step(session, older_than_hours=72, limit=BATCH_SIZE)
                        wall = time.perf_counter() - began
                        server = (pg.server_ticks() - ticks) * TICK
                        session.rollback()  # the same rows for the next round
                    figures[name].append((wall, server, deleted))
            engine.dispose()
            machine = _machine.render(_machine.describe(url, None))
        finally:
            pg.stop()
    print(f"retention: one batch ({BATCH_SIZE} rows at most) with {args.waiting} signals waiting")
    print(f"  old rows    {args.old} sink messages and {args.old} messages, one in ten kept")
    for name, rounds in figures.items():
        walls = ", ".join(f"{w:.2f}" for w, _, _ in rounds)
        print(
            f"  {name:<13} wall median {statistics.median(w for w, _, _ in rounds):.3f} s"
            f" (rounds: {walls}), PostgreSQL CPU median"
            f" {statistics.median(s for _, s, _ in rounds):.2f} s, deleted {rounds[0][2]}"
        )
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
