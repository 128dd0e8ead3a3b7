"""The cost of a deadline: N sink signals whose mail never comes, expired.

    uv run python bench/expiry.py [--signals 3000] [--deadline 20]

Starts `signalbox-server up` (API, SMTP sink, worker, beat; no Flower) on the
embedded default, creates `--signals` sink signals from `--creators` (8)
client threads, each with a `--deadline`-second deadline and no mail, then
waits until every one has expired and its dead letter was alerted by the
`dead_letter` queue's consumer. Prints how long the expiries took after the
last deadline, the expiry lateness (expired_at - deadline: p50, p99, max),
and the CPU each process kind used per expired signal from the first
deadline on: what one deadline costs the stack, the figure that bounds how
fast an overload's backlog of final looks drains.

With `--pg-stat-statements`, the statements of that window per expired
signal. A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack
import idle
from _stack import KINDS

TIMEOUT_SECONDS = 1800


def _counts(stack: _stack.UpStack, run_id: str) -> tuple[int, int]:
    """(signals of the run still waiting, dead letters not yet alerted)."""
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM signals WHERE run_id = %s AND status = 'waiting'),"
            "       (SELECT count(*) FROM dead_letters WHERE run_id = %s AND alerted_at IS NULL)",
            (run_id, run_id),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _lateness(stack: _stack.UpStack, run_id: str) -> tuple[list[float], float, int]:
    """Sorted expiry lateness (s), seconds from the last deadline to the last
    expiry, and the final looks made (checks begun at or after the deadline)."""
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        late = [
            float(r[0])
            for r in conn.execute(
                "SELECT extract(epoch FROM expired_at - expires_at) FROM signals"
                " WHERE run_id = %s AND status = 'expired' ORDER BY 1",
                (run_id,),
            )
        ]
        row = conn.execute(
            "SELECT extract(epoch FROM max(expired_at) - max(expires_at)) FROM signals"
            " WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        looks = conn.execute(
            "SELECT count(*) FROM checks c JOIN signals s ON s.id = c.signal_id"
            " WHERE s.run_id = %s AND c.started_at >= s.expires_at",
            (run_id,),
        ).fetchone()
    return (
        late,
        float(row[0]) if row and row[0] is not None else float("nan"),
        (int(looks[0]) if looks else 0),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=3000)
    parser.add_argument("--deadline", type=float, default=20.0, help="seconds (20)")
    parser.add_argument("--creators", type=int, default=8)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--pg-stat-statements", action="store_true")
    args = parser.parse_args()
    if args.signals < 1 or args.deadline <= 0:
        parser.error("--signals at least 1, --deadline positive")
    env = {"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(args.signals + 1000)}
    print("starting signalbox-server up on embedded PostgreSQL and Redis ...", flush=True)
    with _stack.running_stack(
        flower=False, keep=args.keep, env_extra=env, pg_stat_statements=args.pg_stat_statements
    ) as stack:
        run_id = f"expiry-{uuid.uuid4().hex[:8]}"
        began = time.perf_counter()
        seconds, errors = idle.create_many(
            stack, run_id, args.signals, args.creators, expires_in=args.deadline, max_checks=30
        )
        print(f"  {args.signals} created in {seconds:.1f} s, {errors} errors", flush=True)
        # The window measured opens at the first deadline.
        time.sleep(max(0.0, began + args.deadline - time.perf_counter()))
        if args.pg_stat_statements:
            _stack.stat_reset(stack)
        before = stack.processes.cpu_seconds()
        window = time.perf_counter()
        waiting = unalerted = -1
        while time.perf_counter() - window < TIMEOUT_SECONDS:
            waiting, unalerted = _counts(stack, run_id)
            if waiting == 0 and unalerted == 0:
                break
            time.sleep(0.5)
        spent = time.perf_counter() - window
        cpu = _stack.cpu_delta(before, stack.processes.cpu_seconds())
        load = _stack.load_average()
        late, after_last, final_looks = _lateness(stack, run_id)
        statements = (
            _stack.statements_report(stack, len(late), 12, unit="expiry")
            if args.pg_stat_statements
            else ""
        )
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    expired = len(late)
    total = sum(cpu[k] for k in KINDS)
    print()
    print("expiry: sink signals whose mail never comes")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/expiry.py', *sys.argv[1:]])}")
    print(f"  load avg    {load} (at the end)")
    print()
    rows = [
        ("created", f"{args.signals} in {seconds:.1f} s ({errors} errors)"),
        ("expired / still waiting / not alerted", f"{expired} / {waiting} / {unalerted}"),
        ("final looks made", f"{final_looks}"),
        ("window (first deadline to the last alert)", f"{spent:.1f} s"),
        ("last deadline to last expiry", f"{after_last:.1f} s"),
        ("expiries per second of the window", f"{expired / spent:.0f}"),
        ("lateness p50", f"{_stack.percentile(late, 50):.2f} s"),
        ("lateness p99", f"{_stack.percentile(late, 99):.2f} s"),
        ("lateness max", f"{(late[-1] if late else float('nan')):.2f} s"),
        ("stack CPU per expiry", f"{total / max(1, expired) * 1000:.2f} ms"),
    ]
    print(_stack.table(rows, ("figure", "value")))
    print()
    print(
        _stack.table(
            [(k, f"{cpu[k]:.2f}", f"{cpu[k] / max(1, expired) * 1000:.2f}") for k in KINDS]
            + [("all (stack)", f"{total:.2f}", f"{total / max(1, expired) * 1000:.2f}")],
            ("process", "CPU s", "ms per expiry"),
        )
    )
    if statements:
        print()
        print(statements)
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
