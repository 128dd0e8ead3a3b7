"""Full lifecycles per second: N clients, each create → SMTP delivery → long poll
`found` → claim → consume, in a loop for D seconds.

    uv run python bench/lifecycle.py [--clients 16] [--duration 60] [--warmup 5]
    uv run python bench/lifecycle.py --clients 4 --duration 15        # quick

Starts `signalbox-server up` (API, SMTP sink, worker, beat, Flower) on the
embedded default, runs `pgbench -i` and `pgbench -N -c 8 -j 2 -T 10` into a
separate database of the same embedded PostgreSQL, once before the lifecycles
and once after them (never at the same time), then runs the clients (threads
of this process, one SMTP connection per email, like an application) and
prints:

- **the unit**: the CPU of every process of the stack (API, sink and its
  parse pool, worker parent and pool children, beat, Flower, embedded
  PostgreSQL and Redis with their children; not this script) per completed
  lifecycle, divided by PostgreSQL's own CPU per pgbench -N transaction
  (the server processes' CPU over a pgbench run divided by the transactions
  it processed; the two runs averaged). The benchmark's clients are left
  out; the machine's speed cancels only in part (PostgreSQL and Python do
  not scale alike from one machine to the next, and autovacuum after the
  lifecycles lands in the second run: bench/README.md);
- lifecycles/s and their ratio to pgbench -N's tps;
- CPU seconds per lifecycle of each process kind, from /proc/<pid>/stat
  (utime + stime of each tree: api, worker parent + pool children, smtp,
  beat, flower, postgres = every process of the embedded server, redis),
  over the measured window only;
- time to found (SMTP `250` to DATA → long poll answered `found`) p50/p99/max;
- the machine, with its load average.

With `--pg-stat-statements` the embedded PostgreSQL preloads
pg_stat_statements and the statements per lifecycle (calls / lifecycles,
by statement) are printed too. `--py-spy SECONDS` records py-spy profiles of
the API, one worker pool child and the sink during the measured window
(needs `py-spy` in the venv; files under `--profile-dir`).

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import smtplib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack
from _stack import HOST, KINDS

LONG_POLL_SECONDS = 30
SMTP_TIMEOUT_SECONDS = 60  # the first message warms the sink up (imports, pools)
WARMUP_LIFECYCLES = 3  # one after the other, before the clients start


def verification_mail(recipient: str, marker: str, run_id: str) -> EmailMessage:
    """The mail of one lifecycle: its subject carries the signal's marker."""
    msg = EmailMessage()
    msg["From"], msg["To"] = "app@example.test", recipient
    msg["Subject"] = f"Verify your address ({marker})"
    msg["X-Signalbox-Run"] = run_id
    msg.set_content(f"Your code is 482913. https://example.test/verify?m={marker}")
    return msg


@dataclass
class Lifecycle:
    ended: float  # perf_counter when consume answered (or the error happened)
    found_seconds: float | None = None
    ok: bool = False
    error: str = ""


@dataclass
class Client:
    stack: _stack.UpStack
    run_id: str
    index: int
    stop_at: float
    results: list[Lifecycle] = field(default_factory=list)

    def run(self) -> None:
        with httpx.Client(
            base_url=self.stack.api_url,
            headers={"Authorization": f"Bearer {self.stack.token}"},
            timeout=httpx.Timeout(LONG_POLL_SECONDS + 15, connect=5),
        ) as api:
            n = 0
            while time.perf_counter() < self.stop_at:
                self.results.append(self.one(api, f"c{self.index}-{n}"))
                n += 1

    def one(self, api: httpx.Client, case: str) -> Lifecycle:
        recipient = f"user+{self.run_id}-{case}@example.test"
        marker = uuid.uuid4().hex[:12]
        try:
            created = api.post(
                "/v1/signals",
                json={
                    "run_id": self.run_id,
                    "test_case": case,
                    "recipient": recipient,
                    "subject_contains": marker,
                    "expires_in_seconds": 120,
                },
            )
            created.raise_for_status()
            signal_id = created.json()["signal_id"]
            msg = verification_mail(recipient, marker, self.run_id)
            with smtplib.SMTP(HOST, self.stack.smtp_port, timeout=SMTP_TIMEOUT_SECONDS) as smtp:
                smtp.send_message(msg)
                delivered = time.perf_counter()  # the sink answered 250 to DATA
            view = api.get(f"/v1/signals/{signal_id}", params={"wait": LONG_POLL_SECONDS})
            answered = time.perf_counter()
            view.raise_for_status()
            if view.json()["result"] != "found":
                return Lifecycle(answered, error=f"not found: {view.json()['result']}")
            claimed = api.post(
                f"/v1/signals/{signal_id}/claim", json={"run_id": self.run_id, "lease_seconds": 90}
            )
            claimed.raise_for_status()
            consumed = api.post(f"/v1/claims/{claimed.json()['claim_id']}/consume")
            consumed.raise_for_status()
            return Lifecycle(time.perf_counter(), answered - delivered, ok=True)
        except (httpx.HTTPError, smtplib.SMTPException, OSError, KeyError, ValueError) as exc:
            return Lifecycle(time.perf_counter(), error=f"{type(exc).__name__}: {exc}")


# ---------------------------------------------------------------- profiling


def _py_spy(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes] | None:
    binary = Path(sys.executable).with_name("py-spy")
    binary_path = str(binary) if binary.exists() else shutil.which("py-spy")
    if not binary_path:
        print("py-spy not found: pip install py-spy into the venv", file=sys.stderr)
        return None
    # --subprocesses: the API runs its requests in uvicorn's worker processes.
    cmd = [binary_path, "record", "-p", str(pid), "--subprocesses", "-f", "raw", "-d", str(seconds)]
    return subprocess.Popen(
        # --gil: only samples holding the GIL, i.e. Python on the CPU, not waiting.
        [*cmd, "-r", "50", "--gil", "--nonblocking", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


# ---------------------------------------------------------------- the unit


@dataclass
class PgbenchUnit:
    """pgbench -N before and after the lifecycles, and PostgreSQL's CPU seconds
    per transaction in each."""

    before: _stack.PgbenchResult
    after: _stack.PgbenchResult
    cpu_before: float
    cpu_after: float

    @property
    def cpu_per_transaction(self) -> float:
        return (self.cpu_before + self.cpu_after) / 2

    @property
    def tps(self) -> float:
        return (self.before.tps + self.after.tps) / 2


def _store_others(stack: _stack.UpStack, count: int) -> None:
    """`count` small sink messages, each to an address no client uses,
    received over the last minute, then ANALYZE (as autovacuum would)."""
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size,"
            " raw, received_at)"
            " SELECT 'app@example.test', ARRAY[a], ARRAY[a], 1, 'x'::bytea,"
            "        now() - (g %% 60) * interval '1 second'"
            "   FROM (SELECT g, format('other-%%s@example.test', g) AS a"
            "           FROM generate_series(1, %s) g) o",
            (count,),
        )
        conn.execute("ANALYZE sink_messages")


def pgbench_cost(
    stack: _stack.UpStack, seconds: int, *, initialize: bool
) -> tuple[_stack.PgbenchResult, float]:
    """One pgbench -N run on the stack's PostgreSQL and the server's CPU seconds
    per transaction it processed (every process of the embedded server; the
    stack is idle meanwhile, but the server's own background work, autovacuum
    and checkpoints, counts too)."""
    if initialize:  # -i and a short warm-up run, not measured
        _stack.pgbench_tps(stack, seconds=2)
    before = stack.processes.cpu_seconds()["postgres"]
    result = _stack.pgbench_tps(stack, seconds=seconds, initialize=False)
    spent = stack.processes.cpu_seconds()["postgres"] - before
    return result, spent / max(1, result.transactions)


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (16)")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds (60)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds not measured (5)")
    parser.add_argument("--pgbench-seconds", type=int, default=10, help="pgbench -T (10)")
    parser.add_argument("--no-flower", action="store_true", help="run the stack without Flower")
    parser.add_argument("--worker-concurrency", type=int, default=0)
    parser.add_argument(
        "--api-workers", type=int, default=0, help="SIGNALBOX_API_WORKERS (up's default)"
    )
    parser.add_argument("--pg-stat-statements", action="store_true")
    parser.add_argument("--top", type=int, default=40, help="statements listed (40)")
    parser.add_argument("--py-spy", type=int, default=0, metavar="SECONDS")
    parser.add_argument(
        "--profile-dir", type=Path, default=Path(tempfile.gettempdir()) / "signalbox-profiles"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    parser.add_argument(
        "--stored",
        type=int,
        default=0,
        metavar="N",
        help="sink messages to other addresses stored before the run, within every"
        " signal's near-miss lookback (a busy shared sink; 0)",
    )
    args = parser.parse_args()
    if args.clients < 1 or args.duration <= 0 or args.stored < 0:
        parser.error("--clients must be at least 1, --duration positive, --stored not negative")
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("interrupted; the stack was stopped", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    print("starting signalbox-server up on embedded PostgreSQL and Redis ...", flush=True)
    with _stack.running_stack(
        flower=not args.no_flower,
        worker_concurrency=args.worker_concurrency,
        keep=args.keep,
        pg_stat_statements=args.pg_stat_statements,
        env_extra={"SIGNALBOX_API_WORKERS": str(args.api_workers)} if args.api_workers else None,
    ) as stack:
        settings = _stack.postgres_settings(stack)
        print(f"running {_stack.postgres_bin('pgbench')} -i, then -N ...", flush=True)
        pgbench, pg_before = pgbench_cost(stack, args.pgbench_seconds, initialize=True)
        print(f"pgbench -N: {pgbench.tps:.0f} tps, {pg_before * 1e6:.0f} µs per tx", flush=True)
        if args.stored:
            print(f"storing {args.stored} sink messages to other addresses ...", flush=True)
            _store_others(stack, args.stored)
        time.sleep(2)  # let the server settle after pgbench
        run_id = f"bench-{uuid.uuid4().hex[:10]}"
        # First lifecycles pay for imports, pools and Celery's first send: not measured.
        warm = Client(stack, run_id, 999, 0.0)
        with httpx.Client(
            base_url=stack.api_url,
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=httpx.Timeout(LONG_POLL_SECONDS + 15, connect=5),
        ) as api:
            for i in range(WARMUP_LIFECYCLES):
                result = warm.one(api, f"warm-{i}")
                status = "ok" if result.ok else result.error
                print(f"warm-up lifecycle {i + 1}: {status}", flush=True)
        started = time.perf_counter()
        window_start = started + args.warmup
        window_end = window_start + args.duration
        clients = [Client(stack, run_id, i, window_end) for i in range(args.clients)]
        threads = [threading.Thread(target=c.run, name=f"client-{c.index}") for c in clients]
        print(
            f"{args.clients} clients, {args.warmup:.0f} s warm-up, {args.duration:.0f} s"
            " measured ...",
            flush=True,
        )
        for t in threads:
            t.start()
        time.sleep(max(0.0, window_start - time.perf_counter()))
        if args.pg_stat_statements:
            _stack.stat_reset(stack)
        cpu_before = stack.processes.cpu_seconds()
        spies: list[tuple[str, Path, subprocess.Popen[bytes]]] = []
        if args.py_spy:
            args.profile_dir.mkdir(parents=True, exist_ok=True)
            children = stack.processes.worker_children()
            # Each sink process (not their supervisor, when there are several).
            sinks = stack.processes.listening(stack.smtp_port)
            targets = {
                "api": stack.processes.pid("api"),
                "worker-child": children[0] if children else None,
                **{f"smtp-{i}" if i else "smtp": pid for i, pid in enumerate(sinks)},
            }
            for name, pid in targets.items():
                if pid is None:
                    continue
                out = args.profile_dir / f"{name}.txt"
                spy = _py_spy(pid, min(args.py_spy, int(args.duration)), out)
                if spy is not None:
                    spies.append((name, out, spy))
        time.sleep(max(0.0, window_end - time.perf_counter()))
        cpu_after = stack.processes.cpu_seconds()
        load = _stack.load_average()
        statements = ""
        measured = [r for c in clients for r in c.results if window_start <= r.ended < window_end]
        done = [r for r in measured if r.ok]
        if args.pg_stat_statements:
            statements = _stack.statements_report(stack, len(done), args.top)
        for t in threads:
            t.join(timeout=LONG_POLL_SECONDS + 30)
        time.sleep(2)  # the last lifecycles' tasks and events settle before pgbench
        print("running pgbench -N again ...", flush=True)
        pgbench_after, pg_after = pgbench_cost(stack, args.pgbench_seconds, initialize=False)
        print(
            f"pgbench -N: {pgbench_after.tps:.0f} tps, {pg_after * 1e6:.0f} µs per tx", flush=True
        )
        for name, out, spy in spies:
            try:
                _, err = spy.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()
                err = b"timed out"
            status = "written" if out.exists() else f"failed: {err.decode(errors='replace')[-300:]}"
            print(f"py-spy {name}: {out} {status}")
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    unit = PgbenchUnit(pgbench, pgbench_after, pg_before, pg_after)
    report(args, unit, settings, measured, done, cpu_before, cpu_after, load, machine)
    if statements:
        print(statements)
    return 0


def report(
    args: argparse.Namespace,
    unit: PgbenchUnit,
    pg_settings: str,
    measured: list[Lifecycle],
    done: list[Lifecycle],
    cpu_before: dict[str, float],
    cpu_after: dict[str, float],
    load: str,
    machine: str,
) -> None:
    n = len(done)
    rate = n / args.duration
    found = sorted(r.found_seconds for r in done if r.found_seconds is not None)
    cpu = _stack.cpu_delta(cpu_before, cpu_after)
    stack_cpu = sum(cpu[k] for k in KINDS)
    errors = [r.error for r in measured if not r.ok]
    print()
    print("lifecycles: create -> SMTP delivery -> long poll `found` -> claim -> consume")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/lifecycle.py', *sys.argv[1:]])}")
    print(
        f"  clients     {args.clients}, {args.duration:.0f} s measured"
        f" ({args.warmup:.0f} s warm-up)"
    )
    if args.stored:
        print(f"  stored      {args.stored} sink messages to other addresses, before the run")
    print(f"  postgres    {pg_settings}")
    print(f"  load avg    {load} (at the end of the measured window)")
    print()
    per_lifecycle = stack_cpu / max(1, n)
    tx = unit.cpu_per_transaction
    rows = [
        (
            "stack CPU per lifecycle",
            f"{per_lifecycle * 1000:.2f} ms = {per_lifecycle / tx:.1f} pgbench-N transactions"
            if n and tx
            else "n/a",
        ),
        (
            "PostgreSQL CPU per pgbench-N tx",
            f"{tx * 1e6:.0f} µs (before {unit.cpu_before * 1e6:.0f}, after"
            f" {unit.cpu_after * 1e6:.0f})",
        ),
        ("lifecycles completed", f"{n}"),
        ("errors", f"{len(errors)}" + (f" (first: {errors[0][:80]})" if errors else "")),
        ("lifecycles/s", f"{rate:.1f}"),
        (
            f"{unit.before.command} tps",
            f"{unit.tps:.0f} (before {unit.before.tps:.0f}, after {unit.after.tps:.0f})",
        ),
        ("ratio to pgbench -N", f"{rate / unit.tps:.4f} x"),
        ("time to found p50", f"{_stack.percentile(found, 50) * 1000:.1f} ms"),
        ("time to found p99", f"{_stack.percentile(found, 99) * 1000:.1f} ms"),
        ("time to found max", f"{(found[-1] if found else float('nan')) * 1000:.1f} ms"),
        (
            "time to found mean",
            f"{(statistics.fmean(found) if found else float('nan')) * 1000:.1f} ms",
        ),
    ]
    print(_stack.table(rows, ("figure", "value")))
    print()
    cpu_rows = [
        (
            kind,
            f"{cpu[kind]:.2f}",
            f"{cpu[kind] / args.duration * 100:.0f} %",
            f"{cpu[kind] / max(1, n) * 1000:.1f}",
        )
        for kind in KINDS
    ]
    cpu_rows.append(
        (
            "all (stack)",
            f"{stack_cpu:.2f}",
            f"{stack_cpu / args.duration * 100:.0f} %",
            f"{stack_cpu / max(1, n) * 1000:.1f}",
        )
    )
    cpu_rows.append(
        (
            "client (this script)",
            f"{cpu['client']:.2f}",
            f"{cpu['client'] / args.duration * 100:.0f} %",
            f"{cpu['client'] / max(1, n) * 1000:.1f}",
        )
    )
    print(_stack.table(cpu_rows, ("process", "CPU s", "of a core", "CPU ms/lifecycle")))
    print("machine")
    print(machine)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
