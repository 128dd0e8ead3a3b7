"""CPU per request, by endpoint: one client, one request at a time.

    uv run python bench/requests.py [--count 1000]

Starts `signalbox-server up` on the embedded default (without Flower) and,
for each step, makes `--count` requests one after the other and prints the
CPU each process spent per request (from /proc, over that step only) and
the client's latency p50/p99. The steps are a lifecycle's requests, each
over its own signals:

- `create`: `POST /v1/signals` (a new key each time; a first look follows);
- `read`: `GET /v1/signals/{id}` of a waiting signal;
- then one SMTP delivery per signal (not measured) until all are found;
- `read found`: `GET /v1/signals/{id}?wait=30` of a found signal (answered
  at once);
- `claim`: `POST /v1/signals/{id}/claim`;
- `consume`: `POST /v1/claims/{id}/consume`.

Unlike `lifecycle.py`, nothing else competes for the cores, so the figures
are what a request costs, not what it costs under contention. A benchmark
prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import smtplib
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
import _stack
from _stack import HOST
from lifecycle import verification_mail

FOUND_TIMEOUT_SECONDS = 120
SHOWN = ("api", "worker", "smtp", "postgres", "redis")


def _step(
    stack: _stack.UpStack, name: str, items: list[str], request: Callable[[str], httpx.Response]
) -> tuple[str, ...]:
    latencies: list[float] = []
    before = stack.processes.cpu_seconds()
    for item in items:
        started = time.perf_counter()
        response = request(item)
        latencies.append(time.perf_counter() - started)
        response.raise_for_status()
    time.sleep(1.0)  # what the request set off (a first look, a notification) ends
    delta = _stack.cpu_delta(before, stack.processes.cpu_seconds())
    latencies.sort()
    per = {k: 1000 * delta[k] / len(items) for k in SHOWN}
    return (
        name,
        *(f"{per[k]:.2f}" for k in SHOWN),
        f"{sum(per.values()):.2f}",
        f"{1000 * _stack.percentile(latencies, 50):.2f}",
        f"{1000 * _stack.percentile(latencies, 99):.2f}",
    )


def _deliver(stack: _stack.UpStack, recipients: list[tuple[str, str]], run_id: str) -> None:
    with smtplib.SMTP(HOST, stack.smtp_port, timeout=60) as smtp:
        for recipient, marker in recipients:
            smtp.send_message(verification_mail(recipient, marker, run_id))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="requests per step (1000)")
    args = parser.parse_args()
    run_id = f"req-{uuid.uuid4().hex[:8]}"
    rows: list[tuple[str, ...]] = []
    with (
        _stack.running_stack(flower=False) as stack,
        httpx.Client(
            base_url=stack.api_url,
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=httpx.Timeout(60, connect=5),
        ) as api,
    ):
        markers: dict[str, tuple[str, str]] = {}

        def create(case: str) -> httpx.Response:
            recipient = f"user+{run_id}-{case}@example.test"
            marker = uuid.uuid4().hex[:12]
            response = api.post(
                "/v1/signals",
                json={
                    "run_id": run_id,
                    "test_case": case,
                    "recipient": recipient,
                    "subject_contains": marker,
                    "expires_in_seconds": 600,
                },
            )
            if response.status_code == 201:
                markers[response.json()["signal_id"]] = (recipient, marker)
            return response

        for n in range(20):  # warm: imports, pools, prepared statements
            create(f"warm-{n}")
        markers.clear()
        rows.append(_step(stack, "create", [f"c{n}" for n in range(args.count)], create))
        ids = list(markers)
        rows.append(_step(stack, "read", ids, lambda s: api.get(f"/v1/signals/{s}")))
        _deliver(stack, list(markers.values()), run_id)
        deadline = time.monotonic() + FOUND_TIMEOUT_SECONDS
        for signal_id in ids:
            view = api.get(
                f"/v1/signals/{signal_id}",
                params={"wait": max(1, min(30, int(deadline - time.monotonic())))},
            )
            if view.json()["result"] != "found":
                print(f"{signal_id} not found: {view.json()['result']}", file=sys.stderr)
                return 1
        rows.append(_step(stack, "read found", ids, lambda s: api.get(f"/v1/signals/{s}?wait=30")))
        claims: list[str] = []

        def claim(signal_id: str) -> httpx.Response:
            response = api.post(
                f"/v1/signals/{signal_id}/claim", json={"run_id": run_id, "lease_seconds": 300}
            )
            if response.status_code == 200:
                claims.append(response.json()["claim_id"])
            return response

        rows.append(_step(stack, "claim", ids, claim))
        rows.append(_step(stack, "consume", claims, lambda c: api.post(f"/v1/claims/{c}/consume")))
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    print(f"CPU ms per request, one client, {args.count} requests per step")
    print(_stack.table(rows, ("step", *SHOWN, "all", "p50 ms", "p99 ms")))
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
