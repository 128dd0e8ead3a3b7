"""The floor of a create with its own writes: what idle.py's creates/s can reach.

    uv run python bench/create_floor.py [--waiting 20000] [--count 8000]
    uv run python bench/create_floor.py --waiting 2000 --count 2000   # quick

`floor.py --creates` prices a create's database work at one pgbench -N
transaction. A create writes more than that: the signal with its indexes,
its idempotency key, its address hold, its first look's check row and the
namespace's waiting count, all in one statement, committed durably. This
benchmark measures that statement alone, and puts it beside the rest of
the floor and beside the real API, on one stack, back to back:

1. the stack (`signalbox-server up --no-flower` on the embedded default)
   with `--waiting` sink signals created through its API, then
   `VACUUM (ANALYZE)` (no measure pays for the fill's autovacuum);
2. **the API**: `--count` creates from idle.py's creators (8 threads of this
   process), as `idle.py` makes them: creates/s and CPU per create of the
   client, the API and PostgreSQL;
3. **the statements alone**: the same number of creates from 8 threads of
   this process through the repository functions the API runs
   (`signals_db.signal_create_if_clear` with the first look the create
   makes, then `takes_db.signal_due_if_mail`, the read after it): no HTTP,
   no FastAPI, no use case. Once with each unit on a connection of the
   application's pool (as the API runs them), once on a psycopg connection
   each thread holds (no pool). CPU per create of this process and of
   PostgreSQL;
4. **the bare API** (`floor.py`'s FastAPI app answering a fixed body after
   validating it): idle.py's creators against it, CPU per create of the
   client and the bare API.

The floor of a create is the client's CPU (4), the bare API's (4), the
statements' client on held connections (3) and PostgreSQL's (3): what one
create costs when the API does nothing but validate and run its
statements; the same with the pool's client is printed beside it. The most
creates/s the cores allow at it is cores / floor. A benchmark prints
figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack
import floor
import idle


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _values(run_id: str, i: int, max_claims: int) -> dict[str, Any]:
    from app.domain.ids import new_id

    # What `signal_create` inserts for idle.py's create (a sink signal).
    return {
        "id": new_id("sig"),
        "namespace": "default",
        "idempotency_key": f"{run_id}:floor-{i}",
        "run_id": run_id,
        "test_case": f"floor-{i}",
        "recipient": f"floor{i}-{run_id}@example.test",
        "subject_contains": "never sent",
        "body_contains": None,
        "received_after": None,
        "expires_in": 3600.0,
        "max_checks": 10000,
        "provider": "sink",
        "require_run_marker": False,
        "metadata": {},
        "max_claims": max_claims,
        "expect": "first",
        "settle_seconds": None,
        "first_check_in": 0.0,
    }


class _Held:
    """A psycopg connection held by one thread, shaped as the runner reads a
    SQLAlchemy connection (`.connection.driver_connection`): the statements
    without the pool's checkout and return."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.driver = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))
        self.driver.autocommit = True
        self.connection = self

    @property
    def driver_connection(self) -> Any:
        return self.driver


def statements_alone(
    stack: _stack.UpStack, count: int, threads: int, *, held: bool = False
) -> dict[str, float]:
    """`count` creates made by the repository functions from `threads`
    threads, each unit on a connection of the application's pool, or with
    `held` on a psycopg connection each thread holds."""
    os.environ["SIGNALBOX_DATABASE_URL"] = stack.database_url()
    os.environ.setdefault("SIGNALBOX_DATA_DIR", str(stack.data_dir))
    os.environ.setdefault("SIGNALBOX_BROKER_URL", stack.redis_url)
    from app.db import signals as signals_db
    from app.db import takes as takes_db
    from app.db.create_look import FirstLook
    from app.db.engine import autocommit
    from app.domain.ids import new_id
    from app.settings import get_settings

    settings = get_settings()
    run_id = f"floor-{uuid.uuid4().hex[:8]}"
    indexes = iter(range(count))
    lock = threading.Lock()
    errors = [0]

    local = threading.local()
    helds: list[_Held] = []

    @contextlib.contextmanager
    def unit() -> Iterator[Any]:
        if not held:
            with autocommit() as session:
                yield session
            return
        if not hasattr(local, "held"):
            local.held = _Held(stack.database_url())
            with lock:
                helds.append(local.held)
        yield local.held

    def create(i: int) -> None:
        values = _values(run_id, i, settings.max_claims)
        # The look the create's statement makes when the sink holds nothing
        # (`presumed_first_look` decides its counters; the statement is the same).
        look = FirstLook(True, "scheduled", 600.0, new_id("chk"))
        with unit() as session:
            row = signals_db.signal_create_if_clear(
                session,
                values,
                settings.idempotency_ttl_hours,
                domain_owner=None,
                holdable=True,
                clear_below=settings.max_waiting_per_namespace,
                lookback_hours=settings.max_lookback_hours,
                lookahead_hours=settings.max_lookahead_hours,
                look=look,
            )
            if row["id"] is None or row.get("last_outcome") != "no_match":
                with lock:
                    errors[0] += 1
                return
            takes_db.signal_due_if_mail(
                session,
                row["id"],
                row["recipient"],
                fence=row["check_fence"],
                lookback_seconds=600.0,
            )

    warm = iter(range(count, count + 20 * threads))
    ready = threading.Barrier(threads + 1)
    go = threading.Barrier(threads + 1)

    def worker() -> None:
        # Each thread warms its connection and its prepared statements first.
        for _ in range(20):
            with lock:
                i = next(warm)
            create(i)
        ready.wait()
        go.wait()
        while True:
            with lock:
                i = next(indexes, None)
            if i is None:
                return
            create(i)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    ready.wait()
    before = (_own_cpu(), stack.processes.cpu_seconds())
    began = time.perf_counter()
    go.wait()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - began
    after = (_own_cpu(), stack.processes.cpu_seconds())
    for one in helds:
        one.driver.close()
    return {
        "per_second": count / seconds,
        "errors": errors[0],
        "client_ms": (after[0] - before[0]) / count * 1000,
        "postgres_ms": (after[1]["postgres"] - before[1]["postgres"]) / count * 1000,
    }


def settle(stack: _stack.UpStack) -> None:
    """Vacuum and analyze after the fill, so that no measure pays for the
    autovacuum the fill would start under it."""
    import psycopg

    url = stack.database_url().replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    time.sleep(2)


def through_api(stack: _stack.UpStack, count: int) -> dict[str, float]:
    """`count` creates from idle.py's creators through the stack's API."""
    before = (_own_cpu(), stack.processes.cpu_seconds())
    seconds, errors = idle.create_many(stack, f"api-{uuid.uuid4().hex[:8]}", count, 8)
    after = (_own_cpu(), stack.processes.cpu_seconds())
    return {
        "per_second": count / seconds,
        "errors": errors,
        "client_ms": (after[0] - before[0]) / count * 1000,
        "api_ms": (after[1]["api"] - before[1]["api"]) / count * 1000,
        "postgres_ms": (after[1]["postgres"] - before[1]["postgres"]) / count * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=20000, help="signals waiting (20000)")
    parser.add_argument("--count", type=int, default=8000, help="creates per measure (8000)")
    args = parser.parse_args()
    if args.waiting < 0 or args.count < 1:
        parser.error("--waiting must be at least 0, --count at least 1")
    env = {"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(args.waiting + 3 * args.count + 10000)}
    os.environ.update(env)  # this process's statements are held to the same limit
    print("starting signalbox-server up --no-flower on embedded PostgreSQL and Redis ...")
    with _stack.running_stack(flower=False, env_extra=env) as stack:
        print(f"{args.waiting} signals waiting, made through the API ...", flush=True)
        idle.create_many(stack, f"fill-{uuid.uuid4().hex[:8]}", args.waiting, 8)
        settle(stack)
        print(f"{args.count} creates through the API ...", flush=True)
        api = through_api(stack, args.count)
        print(f"{args.count} creates by the statements alone ...", flush=True)
        pooled = statements_alone(stack, args.count, 8)
        alone = statements_alone(stack, args.count, 8, held=True)
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    print(f"{args.count} creates against the bare API ...", flush=True)
    bare = floor.creates_against_bare(args.count, 8)
    cores = len(os.sched_getaffinity(0))
    floor_ms = bare["client_ms"] + bare["api_ms"] + alone["client_ms"] + alone["postgres_ms"]
    print()
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"the floor of a create, {args.waiting} waiting ({when})")
    rows = [
        ("client (idle.py's creators) against the bare API", f"{bare['client_ms']:.3f}"),
        ("bare API (FastAPI, uvicorn; validates, answers)", f"{bare['api_ms']:.3f}"),
        ("the create's statements: their client (held connections)", f"{alone['client_ms']:.3f}"),
        ("the create's statements: PostgreSQL", f"{alone['postgres_ms']:.3f}"),
        ("floor of a create", f"{floor_ms:.3f}"),
    ]
    print(_stack.table(rows, ("CPU ms per create", "ms")))
    print(
        f"at the floor, {cores} cores allow at most {cores * 1000 / floor_ms:.0f} creates/s"
        f" (the statements alone ran {alone['per_second']:.0f}/s from 8 threads,"
        f" {alone['errors']:.0f} errors; the bare API {bare['per_second']:.0f}/s)"
    )
    pooled_ms = floor_ms - alone["client_ms"] + pooled["client_ms"]
    print(
        f"with the pool's connections (the API's units of work): the statements' client"
        f" {pooled['client_ms']:.3f} ms, PostgreSQL {pooled['postgres_ms']:.3f} ms;"
        f" {pooled['per_second']:.0f}/s from 8 threads ({pooled['errors']:.0f} errors);"
        f" a floor of {pooled_ms:.3f} ms, at most {cores * 1000 / pooled_ms:.0f} creates/s"
    )
    print()
    print("the API, back to back on the same stack (idle.py's creates)")
    rows = [
        ("creates/s (8 clients)", f"{api['per_second']:.0f} ({api['errors']:.0f} errors)"),
        ("client CPU ms per create", f"{api['client_ms']:.3f}"),
        ("API CPU ms per create", f"{api['api_ms']:.3f}"),
        ("PostgreSQL CPU ms per create", f"{api['postgres_ms']:.3f}"),
    ]
    print(_stack.table(rows, ("figure", "value")))
    print("machine\n" + machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
