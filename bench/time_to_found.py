"""Time from an SMTP delivery to its signal being `found`, on the whole stack.

    uv run python bench/time_to_found.py [--signals 200] [--concurrency 20] [--warmup 10]
                                         [--expect first|none]

Starts `signalbox-server up --no-flower` on the embedded default (PostgreSQL
and Redis under a temporary SIGNALBOX_DATA_DIR, free loopback ports), then,
for each signal, `concurrency` at a time:

    POST /v1/signals  →  deliver one matching email over SMTP  →  t0
    GET /v1/signals/{id}?wait=30 (long poll)                   →  t1 when `found`

and prints the distribution of t1 - t0 (the SMTP delivery's completion to the
API answering `found`), the throughput, and the machine. With `--expect none`
the signals expect no email, the delivery makes them `arrived`, and t1 is
when the API answers `arrived`. The long poll is
issued after the delivery, so it can never miss the change: if the signal is
already found it answers at once, and the figure is an upper bound of the true
latency by one HTTP round trip. Warm-up signals are not counted. The stack is
stopped (SIGINT, then wait) at the end, also on errors and on Ctrl-C.

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import smtplib
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine  # the sibling helpers, importable once bench/ is on the path
import _stack
from _stack import HOST, percentile

LONG_POLL_SECONDS = 30


@dataclass
class Sample:
    found_seconds: float | None  # SMTP delivery completed → API answered `found`
    create_seconds: float
    result: str
    error: str = ""


class Bench:
    def __init__(self, stack: _stack.Stack, concurrency: int, expect: str = "first") -> None:
        self.stack = stack
        self.expect = expect
        # The result a delivery leads to: `found`, or `arrived` for `expect: none`.
        self.target = "arrived" if expect == "none" else "found"
        self.run_id = f"bench-{uuid.uuid4().hex[:10]}"
        self.api = httpx.Client(
            base_url=stack.api_url,
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=httpx.Timeout(LONG_POLL_SECONDS + 15, connect=5),
            limits=httpx.Limits(
                max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4
            ),
        )
        self._counter = iter(range(10**9))
        self._lock = threading.Lock()

    def close(self) -> None:
        self.api.close()

    def one(self, label: str) -> Sample:
        with self._lock:
            n = next(self._counter)
        case = f"{label}-{n}"
        recipient = f"user+{self.run_id}-{case}@example.test"
        marker = uuid.uuid4().hex[:12]
        started = time.perf_counter()
        try:
            created = self.api.post(
                "/v1/signals",
                json={
                    "run_id": self.run_id,
                    "test_case": case,
                    "recipient": recipient,
                    "subject_contains": marker,
                    "expires_in_seconds": 120,
                    "expect": self.expect,
                },
            )
            created.raise_for_status()
            create_seconds = time.perf_counter() - started
            signal_id = created.json()["signal_id"]
            msg = EmailMessage()
            msg["From"], msg["To"] = "app@example.test", recipient
            msg["Subject"] = f"Verify your address ({marker})"
            msg["X-Signalbox-Run"] = self.run_id
            msg.set_content(f"Your code is 482913. https://example.test/verify?m={marker}")
            with smtplib.SMTP(HOST, self.stack.smtp_port, timeout=10) as smtp:
                smtp.send_message(msg)
                delivered = time.perf_counter()  # the sink answered 250 to DATA
            view = self.api.get(f"/v1/signals/{signal_id}", params={"wait": LONG_POLL_SECONDS})
            answered = time.perf_counter()
            view.raise_for_status()
            result = view.json()["result"]
        except (httpx.HTTPError, smtplib.SMTPException, OSError, KeyError, ValueError) as exc:
            return Sample(
                None, time.perf_counter() - started, "error", f"{type(exc).__name__}: {exc}"
            )
        found = answered - delivered if result == self.target else None
        return Sample(found, create_seconds, result)

    def batch(self, label: str, count: int, concurrency: int) -> tuple[list[Sample], float]:
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=label) as pool:
            try:
                samples = list(pool.map(lambda _: self.one(label), range(count)))
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
        return samples, time.perf_counter() - started


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def report(args: argparse.Namespace, samples: list[Sample], wall: float, machine: str) -> None:
    found = sorted(s.found_seconds for s in samples if s.found_seconds is not None)
    creates = sorted(s.create_seconds for s in samples if s.result != "error")
    others: dict[str, int] = {}
    for s in samples:
        if s.found_seconds is None:
            others[s.result] = others.get(s.result, 0) + 1
    print()
    target = "arrived" if args.expect == "none" else "found"
    print(
        f"time to {target}: SMTP delivery completed -> GET ?wait={LONG_POLL_SECONDS}"
        f" answered `{target}`"
    )
    print(f"  date         {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command      {' '.join(['bench/time_to_found.py', *sys.argv[1:]])}")
    print(
        f"  signals      {len(samples)} measured ({args.warmup} warm-up not counted), "
        f"{args.concurrency} concurrent"
    )
    print(f"  {target:<12} {len(found)}" + "".join(f", {k} {v}" for k, v in sorted(others.items())))
    if found:
        print(f"  p50      {ms(percentile(found, 50))}")
        print(f"  p90      {ms(percentile(found, 90))}")
        print(f"  p99      {ms(percentile(found, 99))}")
        print(f"  max      {ms(found[-1])}")
        print(f"  mean     {ms(statistics.fmean(found))}")
    if creates:
        print(
            f"  POST /v1/signals p50 {ms(percentile(creates, 50)).strip()}, "
            f"p99 {ms(percentile(creates, 99)).strip()}"
        )
    print(
        f"  throughput   {len(found) / wall:.1f} signals/s {target} "
        f"(create + deliver + {target}, {len(samples)} in {wall:.2f} s)"
    )
    errors = [s.error for s in samples if s.error]
    if errors:
        print(f"  first error  {errors[0]}")
    print(machine)


def main() -> int:
    try:
        return _main()
    except KeyboardInterrupt:
        print("interrupted; the stack was stopped", file=sys.stderr)
        return 130


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=200, help="measured signals (default 200)")
    parser.add_argument(
        "--concurrency", type=int, default=20, help="signals in flight (default 20)"
    )
    parser.add_argument(
        "--warmup", type=int, default=10, help="signals before measuring (default 10)"
    )
    parser.add_argument(
        "--worker-concurrency",
        type=int,
        default=0,
        help="Celery worker processes (default: signalbox-server up's, the cores)",
    )
    parser.add_argument(
        "--expect",
        choices=("first", "none"),
        default="first",
        help="first: time to `found`; none: time to `arrived` (a signal expecting no email)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir and log")
    args = parser.parse_args()
    if args.signals < 1 or args.concurrency < 1 or args.warmup < 0:
        parser.error("--signals and --concurrency must be at least 1, --warmup at least 0")

    print(
        "starting signalbox-server up --no-flower on embedded PostgreSQL and Redis ...", flush=True
    )
    # SIGTERM (a CI runner's stop) cleans up like Ctrl-C: the stack is stopped.
    with _stack.running_stack(
        flower=False, worker_concurrency=args.worker_concurrency, keep=args.keep
    ) as stack:
        print(f"stack up: API {stack.api_url}, SMTP {HOST}:{stack.smtp_port}", flush=True)
        bench = Bench(stack, args.concurrency, args.expect)
        try:
            if args.warmup:
                warm, _ = bench.batch("warmup", args.warmup, min(args.concurrency, args.warmup))
                print(
                    f"warm-up: {sum(s.result == bench.target for s in warm)}/{len(warm)}"
                    f" {bench.target}",
                    flush=True,
                )
            print(f"measuring {args.signals} signals, {args.concurrency} at a time ...", flush=True)
            samples, wall = bench.batch("measure", args.signals, args.concurrency)
        finally:
            bench.close()
        machine = "machine\n" + _machine.render(
            _machine.describe(stack.database_url(), stack.redis_url)
        )
    report(args, samples, wall, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
