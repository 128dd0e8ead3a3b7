"""Idle cost: N waiting signals, no mail, for D seconds; then push latency.

    uv run python bench/idle.py [--signals 10000] [--idle 300] [--push 100]
    uv run python bench/idle.py --waiting 100000 --idle 60        # the 100k goal
    uv run python bench/idle.py --signals 1000 --idle 60 --push 30     # quick

Starts `signalbox-server up` (API, SMTP sink, worker, beat, Flower) on the
embedded default, then:

1. creates `--signals` waiting signals (sink provider, one hour deadline,
   10,000 checks allowed so none expires during the run) from `--creators`
   (8) client threads, and prints creates/s;
2. sends no mail for `--idle` seconds and prints the CPU every process kind
   used meanwhile (from /proc/<pid>/stat, as a share of one core);
3. with those signals still waiting, `--push` times one after the other:
   create one more signal, deliver its email over SMTP, long-poll it; prints
   the time from the sink's `250` to `found` (p50, p99, max): the push latency
   a test sees while the others wait.

With `--pg-stat-statements` the embedded PostgreSQL preloads
pg_stat_statements, and the statements of the creates (step 1, their first
looks included: calls, execution and planning per create, rows written)
are printed after the figures: where PostgreSQL's share of a create goes.

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import smtplib
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack
from _stack import HOST, KINDS

LONG_POLL_SECONDS = 30


def create_many(
    stack: _stack.UpStack,
    run_id: str,
    count: int,
    creators: int,
    *,
    expires_in: float = 3600,
    max_checks: int = 10000,
) -> tuple[float, int]:
    """Create `count` waiting signals from `creators` threads; (seconds, errors)."""
    next_index = iter(range(count))
    lock = threading.Lock()
    errors = [0]

    def creator() -> None:
        with httpx.Client(
            base_url=stack.api_url,
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=60,
        ) as api:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                try:
                    r = api.post(
                        "/v1/signals",
                        json={
                            "run_id": run_id,
                            "test_case": f"idle-{i}",
                            "recipient": f"idle{i}-{run_id}@example.test",
                            "subject_contains": "never sent",
                            "expires_in_seconds": expires_in,
                            "max_checks": max_checks,
                        },
                    )
                    r.raise_for_status()
                except httpx.HTTPError:
                    with lock:
                        errors[0] += 1

    threads = [threading.Thread(target=creator) for _ in range(creators)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began, errors[0]


def push_latency(stack: _stack.UpStack, run_id: str, count: int) -> tuple[list[float], list[str]]:
    """One at a time: create, deliver, long-poll; seconds from `250` to `found`."""
    found: list[float] = []
    problems: list[str] = []
    with httpx.Client(
        base_url=stack.api_url,
        headers={"Authorization": f"Bearer {stack.token}"},
        timeout=LONG_POLL_SECONDS + 15,
    ) as api:
        for i in range(count):
            recipient = f"push{i}-{run_id}@example.test"
            marker = uuid.uuid4().hex[:12]
            try:
                r = api.post(
                    "/v1/signals",
                    json={
                        "run_id": run_id,
                        "test_case": f"push-{i}",
                        "recipient": recipient,
                        "subject_contains": marker,
                        "expires_in_seconds": 120,
                    },
                )
                r.raise_for_status()
                signal_id = r.json()["signal_id"]
                msg = EmailMessage()
                msg["From"], msg["To"] = "app@example.test", recipient
                msg["Subject"] = f"Verify ({marker})"
                msg["X-Signalbox-Run"] = run_id
                msg.set_content("Your code is 482913.")
                with smtplib.SMTP(HOST, stack.smtp_port, timeout=60) as smtp:
                    smtp.send_message(msg)
                    delivered = time.perf_counter()
                view = api.get(f"/v1/signals/{signal_id}", params={"wait": LONG_POLL_SECONDS})
                answered = time.perf_counter()
                view.raise_for_status()
                if view.json()["result"] == "found":
                    found.append(answered - delivered)
                else:
                    problems.append(view.json()["result"])
            except (httpx.HTTPError, smtplib.SMTPException, OSError, KeyError) as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
    return found, problems


def waiting_count(stack: _stack.UpStack) -> int:
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM signals WHERE status = 'waiting'").fetchone()
    return int(row[0]) if row else 0


FIRST_CHECKS_TIMEOUT_SECONDS = 900


def wait_first_checks(stack: _stack.UpStack, timeout: float) -> float:
    """Seconds until no waiting signal lacks its first check and no check
    task the creates sent still waits in the `signals` queue (bounded)."""
    import psycopg
    import redis

    began = time.perf_counter()
    broker = redis.Redis.from_url(stack.redis_url)
    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        while time.perf_counter() - began < timeout:
            row = conn.execute(
                "SELECT count(*) FROM signals WHERE status = 'waiting' AND last_check_at IS NULL"
            ).fetchone()
            if row is not None and int(row[0]) == 0 and broker.llen("signals") == 0:
                break
            time.sleep(0.5)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--signals", "--waiting", type=int, default=10000, help="waiting signals (10000)"
    )
    parser.add_argument("--creators", type=int, default=8, help="creating threads (8)")
    parser.add_argument("--idle", type=float, default=300.0, help="idle seconds measured (300)")
    parser.add_argument(
        "--settle", type=float, default=10.0, help="seconds after the first checks, then measure"
    )
    parser.add_argument("--push", type=int, default=100, help="push-latency samples (100)")
    parser.add_argument("--no-flower", action="store_true", help="run the stack without Flower")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    parser.add_argument(
        "--pg-stat-statements",
        action="store_true",
        help="preload pg_stat_statements and print the creates' statements",
    )
    args = parser.parse_args()
    if args.signals < 1 or args.creators < 1 or args.idle <= 0:
        parser.error("--signals and --creators must be at least 1, --idle positive")
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("interrupted; the stack was stopped", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    # The per-namespace cap on waiting signals would refuse the push samples.
    env = {"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(args.signals + args.push + 1000)}
    print("starting signalbox-server up on embedded PostgreSQL and Redis ...", flush=True)
    with _stack.running_stack(
        flower=not args.no_flower,
        keep=args.keep,
        env_extra=env,
        pg_stat_statements=args.pg_stat_statements,
    ) as stack:
        run_id = f"idle-{uuid.uuid4().hex[:8]}"
        print(f"creating {args.signals} signals from {args.creators} clients ...", flush=True)
        if args.pg_stat_statements:
            _stack.stat_reset(stack)
        create_before = stack.processes.cpu_seconds()
        create_seconds, create_errors = create_many(stack, run_id, args.signals, args.creators)
        create_cpu = _stack.cpu_delta(create_before, stack.processes.cpu_seconds())
        print(f"  {args.signals / create_seconds:.0f} creates/s", flush=True)
        # Idle means after the first check of every signal the creates started.
        first_checks = wait_first_checks(stack, FIRST_CHECKS_TIMEOUT_SECONDS)
        print(
            f"  first checks done and their tasks drained {first_checks:.1f} s after the last"
            " create",
            flush=True,
        )
        # The creates' statements, their first looks (made after the answer) included.
        statements = (
            _stack.statements_report(stack, args.signals, 12, unit="create")
            if args.pg_stat_statements
            else ""
        )
        time.sleep(args.settle)
        waiting_before = waiting_count(stack)
        print(f"{waiting_before} waiting; idle for {args.idle:.0f} s ...", flush=True)
        before = stack.processes.cpu_seconds()
        time.sleep(args.idle)
        idle_cpu = _stack.cpu_delta(before, stack.processes.cpu_seconds())
        idle_load = _stack.load_average()
        print(f"push latency, {args.push} one at a time ...", flush=True)
        found, problems = push_latency(stack, run_id, args.push)
        slowest = max(range(len(found)), key=found.__getitem__) if found else None
        first = found[:3]  # in the order taken: the first pushes after the idle window
        waiting_after = waiting_count(stack)
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    found.sort()
    stack_idle = sum(idle_cpu[k] for k in KINDS)
    stack_create = sum(create_cpu[k] for k in KINDS)
    print()
    print("idle: waiting signals, no mail")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/idle.py', *sys.argv[1:]])}")
    print(f"  load avg    {idle_load} (at the end of the idle window)")
    print()
    rows = [
        (
            f"created ({args.creators} clients)",
            f"{args.signals} in {create_seconds:.1f} s = {args.signals / create_seconds:.0f}/s",
        ),
        ("create errors", f"{create_errors}"),
        ("create CPU, all stack", f"{stack_create / args.signals * 1000:.1f} ms/signal"),
        ("waiting at idle start / after push", f"{waiting_before} / {waiting_after}"),
        ("idle CPU, all stack", f"{stack_idle / args.idle * 100:.1f} % of one core"),
        ("push samples found", f"{len(found)}/{args.push}"),
        ("push latency p50", f"{_stack.percentile(found, 50) * 1000:.1f} ms"),
        ("push latency p99", f"{_stack.percentile(found, 99) * 1000:.1f} ms"),
        ("push latency max", f"{(found[-1] if found else float('nan')) * 1000:.1f} ms"),
        ("slowest push sample", f"#{slowest + 1} of {len(found)}" if slowest is not None else "-"),
        ("first three push samples", " / ".join(f"{s * 1000:.1f}" for s in first) + " ms"),
    ]
    if problems:
        rows.append(("push problems", f"{len(problems)} (first: {problems[0][:60]})"))
    print(_stack.table(rows, ("figure", "value")))
    print()
    cpu_rows = [
        (
            kind,
            f"{idle_cpu[kind]:.2f}",
            f"{idle_cpu[kind] / args.idle * 100:.1f} %",
            f"{create_cpu[kind] / args.signals * 1000:.2f}",
        )
        for kind in KINDS
    ]
    cpu_rows.append(
        (
            "all (stack)",
            f"{stack_idle:.2f}",
            f"{stack_idle / args.idle * 100:.1f} %",
            f"{stack_create / args.signals * 1000:.2f}",
        )
    )
    print(
        _stack.table(cpu_rows, ("process", "idle CPU s", "idle, of a core", "create CPU ms/signal"))
    )
    if statements:
        print()
        print(statements)
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
