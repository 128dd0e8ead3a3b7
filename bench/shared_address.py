"""One shared address: N signals wait on it, each for its own subject; N mails, one at a time.

The pattern of a shared test inbox: every delivery to the address makes every
signal waiting on it due (a push), and its look decides each of them (a check
row each, a near miss for each mail that is not theirs). The work per delivery
therefore grows with the signals waiting on the address; this prints how much.

1. starts `signalbox-server up --no-flower` on the embedded default;
2. creates `--signals` signals on one address, signal i waiting for a subject
   containing `code-i` (15 min deadline);
3. delivers the N mails one at a time (mail i has subject `code-i`, one SMTP
   connection each) and long-polls signal i until `found` after each;
4. prints the latency per delivery (SMTP connect -> `found`) p50/p99/max, the
   CPU of every process over the deliveries (per delivery), and the rows the
   run left (checks, near misses), then the machine.
"""

from __future__ import annotations

import argparse
import smtplib
import sys
import time
import uuid
from email.message import EmailMessage
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack

ADDRESS = "qa-inbox@example.test"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=200, help="signals on the address (200)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args()
    if args.signals < 1:
        parser.error("--signals must be at least 1")
    n = args.signals
    print("starting signalbox-server up --no-flower on embedded PostgreSQL and Redis ...")
    with _stack.running_stack(flower=False, keep=args.keep) as stack:
        run_id = f"shared-{uuid.uuid4().hex[:8]}"
        with stack.client() as api:
            ids = []
            for i in range(n):
                created = api.post(
                    "/v1/signals",
                    json={
                        "run_id": run_id,
                        "test_case": f"case-{i}",
                        "recipient": ADDRESS,
                        "subject_contains": f"code-{i:06d}",
                        "expires_in_seconds": 900,
                    },
                )
                created.raise_for_status()
                ids.append(created.json()["signal_id"])
            print(f"{n} signals waiting on one address; delivering {n} mails one at a time ...")
            time.sleep(2)  # the first looks settle
            cpu_before = stack.processes.cpu_seconds()
            began = time.perf_counter()
            latencies = []
            for i, signal_id in enumerate(ids):
                mail = EmailMessage()
                mail["From"], mail["To"] = "app@example.test", ADDRESS
                mail["Subject"] = f"Your code-{i:06d}"
                mail.set_content("Your code is 482913.")
                start = time.perf_counter()
                with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=10) as smtp:
                    smtp.send_message(mail)
                view = api.get(f"/v1/signals/{signal_id}", params={"wait": 30}).json()
                latencies.append(time.perf_counter() - start)
                if view["status"] != "found":
                    print(f"signal {i} is {view['status']}, not found", file=sys.stderr)
                    return 1
            wall = time.perf_counter() - began
            cpu = _stack.cpu_delta(cpu_before, stack.processes.cpu_seconds())
        with psycopg.connect(stack.database_url(), autocommit=True) as conn:
            rows = {
                table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
                for table in ("checks", "near_misses")
            }
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    latencies.sort()
    ms = [x * 1000 for x in latencies]
    print()
    print("one shared address: N signals waiting, N mails delivered one at a time")
    print(f"  command     {' '.join(['bench/shared_address.py', *sys.argv[1:]])}")
    print(f"  signals     {n} on {ADDRESS}, each for its own subject")
    print(
        f"  delivery -> found  p50 {_stack.percentile(ms, 50):.1f} ms,"
        f" p99 {_stack.percentile(ms, 99):.1f} ms, max {ms[-1]:.1f} ms ({wall:.1f} s in all)"
    )
    print("  CPU per delivery, ms: " + ", ".join(f"{k} {v / n * 1000:.1f}" for k, v in cpu.items()))
    print(f"  rows        checks {rows['checks']}, near misses {rows['near_misses']}")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
