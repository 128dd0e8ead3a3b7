"""The sink's push, one signal at a time, in this process: wall and CPU per push.

    uv run python bench/push.py [--signals 300] [--rounds 3]

On an embedded PostgreSQL and Redis of its own (a temporary directory),
migrated: `--signals` sink signals are created, each with its first look
made (the sink holds nothing for it), and one message to each is stored.
Then, one recipient at a time, `app.usecases.signals.push` with the sink's
in-process check (what the sink does after a `250`): the push makes the
signal due, the look takes it, searches the sink, records the message and
writes `found`. The rounds repeat that on fresh signals; each round prints
the wall time per push (median, p90), this process's CPU per push (user +
system) and PostgreSQL's (the postmaster and its children), and the signals
found. No HTTP, no SMTP, no other process: the push path alone. A benchmark
prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine  # the sibling helpers, importable once bench/ is on the path
import _stack
from floor import _Postgres


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=300, help="pushes per round (300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    args = parser.parse_args()
    if args.signals < 1 or args.rounds < 1:
        parser.error("--signals and --rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="sbx-push-") as tmp:
        data = Path(tmp)
        pg = _Postgres(data)
        redis = None
        try:
            from app.infra.embedded import start_redis

            redis_url, redis = start_redis(data, _stack.free_port())
            os.environ.update(
                SIGNALBOX_DATABASE_URL=pg.database_url(),
                SIGNALBOX_BROKER_URL=redis_url,
                SIGNALBOX_RESULT_BACKEND=redis_url,
            )
            from app.db.migrate import upgrade

            upgrade(pg.database_url())
            rounds = [_round(pg, args.signals) for _ in range(args.rounds)]
            machine = _machine.render(_machine.describe(pg.database_url(), redis_url))
        finally:
            from app.db.engine import get_engine

            get_engine().dispose()  # its connections closed before the server stops
            if redis is not None:
                redis.shutdown()
            pg.stop()
    print(f"\nthe sink's push, one signal at a time, in this process ({args.signals} per round)")
    print("  round  wall p50 ms  wall p90 ms  this process CPU ms  PostgreSQL CPU ms  found")
    for n, (p50, p90, cpu, pg_cpu, found) in enumerate(rounds, start=1):
        print(f"  {n:>5}  {p50:11.2f}  {p90:11.2f}  {cpu:19.2f}  {pg_cpu:17.2f}  {found:>5}")
    medians = [statistics.median(r[i] for r in rounds) for i in range(4)]
    print("  median {:11.2f}  {:11.2f}  {:19.2f}  {:17.2f}".format(*medians) + "   (CPU per push)")
    print("machine\n" + machine)
    return 0


def _round(pg: _Postgres, count: int) -> tuple[float, float, float, float, int]:
    """One round of `count` pushes on fresh signals: (wall p50, wall p90,
    this process's CPU, PostgreSQL's CPU) in ms per push, and how many were found."""
    from app.db import runner as db_runner
    from app.db.engine import autocommit
    from app.settings import get_settings
    from app.usecases import intake, signals
    from app.usecases.checks import process_runner
    from app.usecases.inputs import SignalCreate
    from tests.integration.helpers import mail

    settings = get_settings()
    runner = process_runner(settings)
    run = f"push-{uuid.uuid4().hex[:8]}"
    recipients = [f"p{i}-{uuid.uuid4().hex[:8]}@example.test" for i in range(count)]
    ids = []
    for recipient in recipients:
        req = SignalCreate(
            run_id=run, test_case=recipient, recipient=recipient, expires_in_seconds=600
        )
        created = signals.signal_create(settings, "default", req, None, runner=runner)
        if created.first_look is not None:  # else the create made it
            created.first_look()
        ids.append(str(created.view["signal_id"]))
    for recipient in recipients:
        intake.store_many(settings, [("app@example.test", [recipient], mail(recipient))])
    walls = []
    cpu, pg_ticks = _cpu(), pg.server_ticks()
    for recipient in recipients:
        began = time.perf_counter()
        signals.push("sink", [recipient], runner=runner)
        walls.append(time.perf_counter() - began)
    cpu, pg_ticks = _cpu() - cpu, pg.server_ticks() - pg_ticks
    with autocommit() as session:
        found = db_runner.one(
            session,
            db_runner.variant(
                "bench_push_found",
                "SELECT count(*) AS n FROM signals WHERE status = 'found' AND id = ANY(:ids)",
            ),
            {"ids": ids},
        )
    walls.sort()
    per = 1000 / count
    return (
        walls[count // 2] * 1000,
        walls[int(count * 0.9)] * 1000,
        cpu * per,
        pg_ticks / _stack.CLK_TCK * per,
        int(found["n"]) if found else 0,
    )


if __name__ == "__main__":
    sys.exit(main())
