"""The floor under a lifecycle on this machine: lifecycle.py's own clients
against servers that do nothing, and pgbench -N's PostgreSQL CPU per
transaction. What no implementation on this stack can go below.

    uv run python bench/floor.py [--clients 16] [--duration 20]
    uv run python bench/floor.py --clients 4 --duration 5        # quick

It runs, each in its own process:

- a bare FastAPI app on uvicorn with httptools and uvloop (what the API
  runs on), whose four routes answer a lifecycle's four requests (create,
  read, claim, consume) with a fixed JSON body; create validates its body
  with a pydantic model, as any FastAPI service would. No database, no
  auth, no logging, async routes (no thread hop).
- a bare aiosmtpd sink on uvloop that answers `250` to DATA and keeps
  nothing.
- lifecycle.py's `Client` (the same code, threads of this process): create
  → one SMTP delivery on its own connection → read → claim → consume, in a
  loop for D seconds.
- an embedded PostgreSQL (the one `signalbox-server up` starts) with
  `pgbench -N -c 8 -j 2 -T 10`: its server processes' CPU per transaction.

With `--creates N`, also idle.py's own creators (8 threads) post N creates
to the bare API alone: the floor under idle.py's creates/s (client, bare
API and one pgbench -N transaction per create), and the most creates/s the
cores allow at it.

It prints lifecycles/s against the bare servers and CPU ms per lifecycle
of the client, the bare API and the bare sink; PostgreSQL's CPU per
pgbench -N transaction; and the floor of a lifecycle: those three plus
five transactions at pgbench's cost (create, the sink's store, the check
that marks it found, claim, consume: each must commit). Then the most
lifecycles/s the machine's cores allow at that floor, against 0.05 x
pgbench -N's tps.

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack
import idle
from lifecycle import Client

HOST = "127.0.0.1"
# Transactions a lifecycle commits at least: create, the sink's store, the
# check that records the match, claim, consume.
TRANSACTIONS_PER_LIFECYCLE = 5


# ---------------------------------------------------------------- the bare servers


class Create(BaseModel):
    """The create body, validated as any FastAPI service would (module
    level: FastAPI resolves the route's annotations in the module)."""

    run_id: str
    test_case: str
    recipient: str
    subject_contains: str | None = None
    expires_in_seconds: int = 600


def serve_api(port: int) -> None:

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    signal: dict[str, Any] = {
        "signal_id": "sig_0123456789abcdef",
        "status": "waiting",
        "result": "waiting",
        "run_id": "",
        "test_case": "",
        "recipient": "",
        "provider": "sink",
        "expires_at": "2026-11-30T00:00:00.000000Z",
        "checks_count": 0,
        "max_checks": 20,
    }
    found = {**signal, "status": "found", "result": "found", "checks_count": 1}

    @app.post("/v1/signals")
    async def create(body: Create) -> JSONResponse:
        view = {**signal, "run_id": body.run_id, "test_case": body.test_case}
        return JSONResponse(view | {"recipient": body.recipient}, status_code=201)

    @app.get("/v1/signals/{signal_id}")
    async def read(signal_id: str, wait: float = 0) -> JSONResponse:
        return JSONResponse(found | {"signal_id": signal_id})

    @app.post("/v1/signals/{signal_id}/claim")
    async def claim(signal_id: str) -> JSONResponse:
        return JSONResponse({"claim_id": "clm_0123456789abcdef", "signal_id": signal_id})

    @app.post("/v1/claims/{claim_id}/consume")
    async def consume(claim_id: str) -> JSONResponse:
        return JSONResponse({"receipt_id": "rcp_0123456789abcdef", "claim_id": claim_id})

    uvicorn.run(
        app,
        host=HOST,
        port=port,
        http="httptools",
        loop="uvloop",
        access_log=False,
        log_level="warning",
    )


def _serve_aiosmtpd(handler: object, port: int) -> None:
    """aiosmtpd on uvloop, on a port other processes may share
    (SO_REUSEPORT, as the sink's processes share theirs), forever."""
    import asyncio

    import uvloop
    from aiosmtpd.smtp import SMTP

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(
        loop.create_server(lambda: SMTP(handler, hostname=HOST), HOST, port, reuse_port=True)
    )
    loop.run_forever()


def serve_smtp(port: int) -> None:
    class Discard:
        async def handle_DATA(self, server: object, session: object, envelope: object) -> str:
            return "250 OK"

    _serve_aiosmtpd(Discard(), port)


def serve_smtp_durable(port: int, dsn: str) -> None:
    """The durable floor of a sink: aiosmtpd on uvloop whose `250` follows a
    committed INSERT of the message (sender, recipients, raw bytes) into
    `dsn`'s PostgreSQL. The messages that arrive while one transaction
    commits go in the next one (group commit, on one connection and one
    thread). Nothing else: no push, no parse, no inbox, no chaos rules."""
    import asyncio
    import queue

    import psycopg

    conn = psycopg.connect(dsn)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS floor_mail (id bigserial PRIMARY KEY,"
        " received_at timestamptz NOT NULL DEFAULT now(), mail_from text NOT NULL,"
        " rcpts text[] NOT NULL, raw bytea NOT NULL)"
    )
    conn.commit()
    waiting: queue.SimpleQueue[
        tuple[str, list[str], bytes, asyncio.Future[None], asyncio.AbstractEventLoop]
    ] = queue.SimpleQueue()

    def settle(futures: list[asyncio.Future[None]], error: Exception | None) -> None:
        for future in futures:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def commit_forever() -> None:
        while True:
            batch = [waiting.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(waiting.get_nowait())
            error: Exception | None = None
            try:
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO floor_mail (mail_from, rcpts, raw) VALUES (%s, %s, %s)",
                        [(sender, rcpts, raw) for sender, rcpts, raw, *_ in batch],
                    )
                conn.commit()
            except Exception as exc:  # answered 451 below
                conn.rollback()
                error = exc
            loop = batch[0][4]  # the one event loop of this process
            loop.call_soon_threadsafe(settle, [item[3] for item in batch], error)

    class Store:
        async def handle_DATA(self, server: object, session: object, envelope: Any) -> str:
            loop = asyncio.get_running_loop()
            stored: asyncio.Future[None] = loop.create_future()
            raw = envelope.original_content or envelope.content
            waiting.put((envelope.mail_from, list(envelope.rcpt_tos), bytes(raw), stored, loop))
            try:
                await stored
            except Exception:
                return "451 4.3.0 not stored"
            return "250 OK"

    threading.Thread(target=commit_forever, daemon=True).start()
    _serve_aiosmtpd(Store(), port)


# ---------------------------------------------------------------- measuring


@dataclass
class Bare:
    """What lifecycle.Client needs of a stack."""

    api_url: str
    smtp_port: int
    token: str = "unused"


def _spawn(mode: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, mode, str(port), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _ticks(pid: int) -> int:
    stat = _stack._stat(pid)
    return stat[1] if stat else 0


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _wait_port(port: int, timeout: float = 30.0) -> None:
    import socket

    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port}")


def clients_against_bare(clients: int, duration: float, warmup: float) -> dict[str, float]:
    api_port, smtp_port = _stack.free_port(), _stack.free_port()
    api, smtp = _spawn("--serve-api", api_port), _spawn("--serve-smtp", smtp_port)
    try:
        _wait_port(api_port)
        _wait_port(smtp_port)
        bare = Bare(f"http://{HOST}:{api_port}", smtp_port)
        run_id = f"floor-{uuid.uuid4().hex[:8]}"
        warm = Client(bare, run_id, 999, time.perf_counter() + 1.0)  # type: ignore[arg-type]
        warm.run()
        if not any(r.ok for r in warm.results):
            raise RuntimeError(f"warm-up failed: {warm.results[:1]}")
        window_start = time.perf_counter() + warmup
        window_end = window_start + duration
        runners = [Client(bare, run_id, i, window_end) for i in range(clients)]  # type: ignore[arg-type]
        threads = [threading.Thread(target=c.run) for c in runners]
        for t in threads:
            t.start()
        time.sleep(max(0.0, window_start - time.perf_counter()))
        before = (_own_cpu(), _ticks(api.pid), _ticks(smtp.pid))
        time.sleep(max(0.0, window_end - time.perf_counter()))
        after = (_own_cpu(), _ticks(api.pid), _ticks(smtp.pid))
        for t in threads:
            t.join(timeout=60)
        results = [r for c in runners for r in c.results if window_start <= r.ended < window_end]
        done = sum(1 for r in results if r.ok)
        failed = len(results) - done
    finally:
        for proc in (api, smtp):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    hz = os.sysconf("SC_CLK_TCK")
    n = max(1, done)
    return {
        "lifecycles": done,
        "failed": failed,
        "per_second": done / duration,
        "client_ms": (after[0] - before[0]) / n * 1000,
        "api_ms": (after[1] - before[1]) / hz / n * 1000,
        "smtp_ms": (after[2] - before[2]) / hz / n * 1000,
    }


def creates_against_bare(count: int, creators: int) -> dict[str, float]:
    """idle.py's creators posting `count` creates to the bare API alone."""
    api_port = _stack.free_port()
    api = _spawn("--serve-api", api_port)
    try:
        _wait_port(api_port)
        bare = Bare(f"http://{HOST}:{api_port}", 0)
        run_id = f"floor-{uuid.uuid4().hex[:8]}"
        idle.create_many(bare, run_id, 200, creators)  # type: ignore[arg-type]  # warm-up
        before = (_own_cpu(), _ticks(api.pid))
        seconds, errors = idle.create_many(bare, run_id, count, creators)  # type: ignore[arg-type]
        after = (_own_cpu(), _ticks(api.pid))
    finally:
        api.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            api.wait(timeout=10)
    hz = os.sysconf("SC_CLK_TCK")
    return {
        "creates": count,
        "errors": errors,
        "per_second": count / seconds,
        "client_ms": (after[0] - before[0]) / count * 1000,
        "api_ms": (after[1] - before[1]) / hz / count * 1000,
    }


class _Postgres:
    def __init__(self, data_dir: Path) -> None:
        from app.infra.embedded import start_postgres

        self.url, self.handle = start_postgres(data_dir)
        self.data_dir = data_dir / "postgres"

    def database_url(self, database: str = "signalbox") -> str:
        return str(self.handle.get_uri(database))

    def postmaster(self) -> int:
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def server_ticks(self) -> int:
        return _stack.tree_ticks([self.postmaster()], _stack._all_stats())

    def stop(self) -> None:
        from app.infra.embedded import EmbeddedServices

        EmbeddedServices(_handles=[self.handle]).stop()


def pgbench_floor(seconds: int) -> tuple[_stack.PgbenchResult, float, str]:
    """pgbench -N's tps and its PostgreSQL CPU ms per transaction."""
    with tempfile.TemporaryDirectory(prefix="signalbox-floor-") as tmp:
        pg = _Postgres(Path(tmp))
        try:
            _stack.pgbench_tps(pg, seconds=1)  # type: ignore[arg-type]  # -i and a warm-up
            before = pg.server_ticks()
            result = _stack.pgbench_tps(pg, seconds=seconds, initialize=False)  # type: ignore[arg-type]
            ticks = pg.server_ticks() - before
            version = _machine.postgres_version(pg.database_url())
        finally:
            pg.stop()
    per_tx_ms = ticks / os.sysconf("SC_CLK_TCK") / max(1.0, result.tps * seconds) * 1000
    return result, per_tx_ms, version


def print_create_floor(count: int, pg_ms: float, cores: int) -> None:
    print()
    print(f"{count} creates from 8 threads (idle.py's creators) against the bare API ...")
    made = creates_against_bare(count, 8)
    floor_ms = made["client_ms"] + made["api_ms"] + pg_ms
    print(f"against the bare API: {made['per_second']:.0f} creates/s ({made['errors']:.0f} errors)")
    rows = [
        ("client (idle.py's creators, this process)", f"{made['client_ms']:.3f}"),
        ("bare API (FastAPI, uvicorn, httptools, uvloop)", f"{made['api_ms']:.3f}"),
        ("PostgreSQL: 1 x pgbench -N transaction", f"{pg_ms:.3f}"),
        ("floor of a create", f"{floor_ms:.3f}"),
    ]
    print(_stack.table(rows, ("CPU ms per create", "ms")))
    servers_ms = floor_ms - made["client_ms"]
    print(
        f"at the floor, {cores} cores allow at most {cores * 1000 / floor_ms:.0f} creates/s;"
        f" the bare API and PostgreSQL alone {cores * 1000 / servers_ms:.0f}/s"
    )


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in ("--serve-api", "--serve-smtp"):
        (serve_api if sys.argv[1] == "--serve-api" else serve_smtp)(int(sys.argv[2]))
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-smtp-durable":
        serve_smtp_durable(int(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds (20)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds not measured (3)")
    parser.add_argument("--pgbench-seconds", type=int, default=10, help="pgbench -T (10)")
    parser.add_argument(
        "--creates", type=int, default=0, help="also N creates from 8 threads to the bare API (0)"
    )
    args = parser.parse_args()

    print("pgbench -N on an embedded PostgreSQL ...", flush=True)
    pgbench, pg_ms, pg_version = pgbench_floor(args.pgbench_seconds)
    print(f"pgbench -N: {pgbench.tps:.0f} tps", flush=True)
    time.sleep(2)
    print(f"{args.clients} clients against the bare servers ...", flush=True)
    bare = clients_against_bare(args.clients, args.duration, args.warmup)

    cores = len(os.sched_getaffinity(0))
    servers_ms = bare["api_ms"] + bare["smtp_ms"]
    floor_ms = bare["client_ms"] + servers_ms + TRANSACTIONS_PER_LIFECYCLE * pg_ms
    rows = [
        ("client (lifecycle.py's, this process)", f"{bare['client_ms']:.2f}"),
        ("bare API (FastAPI, uvicorn, httptools, uvloop)", f"{bare['api_ms']:.2f}"),
        ("bare SMTP sink (aiosmtpd, uvloop)", f"{bare['smtp_ms']:.2f}"),
        (
            f"PostgreSQL: {TRANSACTIONS_PER_LIFECYCLE} x pgbench -N transaction ({pg_ms:.3f})",
            f"{TRANSACTIONS_PER_LIFECYCLE * pg_ms:.2f}",
        ),
        ("floor of a lifecycle", f"{floor_ms:.2f}"),
    ]
    goal = 0.05 * pgbench.tps
    print()
    print(
        f"against the bare servers: {bare['per_second']:.1f} lifecycles/s"
        f" ({bare['lifecycles']:.0f} in {args.duration:.0f} s, {bare['failed']:.0f} failed),"
        f" {args.clients} clients"
    )
    print(_stack.table(rows, ("CPU ms per lifecycle", "ms")))
    print()
    print(f"pgbench -N: {pgbench.tps:.0f} tps ({pgbench.command}); 0.05 x = {goal:.0f}/s")
    print(
        f"at the floor, {cores} cores allow at most {cores * 1000 / floor_ms:.0f} lifecycles/s"
        f" = {cores * 1000 / floor_ms / pgbench.tps:.3f} x pgbench -N;"
        f" the servers and PostgreSQL alone {cores * 1000 / (floor_ms - bare['client_ms']):.0f}/s"
    )
    print(
        "a lifecycle at 0.05 x pgbench -N may cost, all processes and the client together,"
        f" {cores * 1000 / goal:.2f} ms of CPU"
    )
    if args.creates:
        print_create_floor(args.creates, pg_ms, cores)
    print()
    print("machine")
    pairs = _machine.describe()
    pairs = [(k, pg_version if k == "PostgreSQL" else v) for k, v in pairs]
    print(_machine.render(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
