"""Where the time from an SMTP delivery to `found` goes, one signal at a time.

    uv run python bench/found_path.py [--signals 100] [--warmup 20]

Starts `signalbox-server up --no-flower` on the embedded default (as
`time_to_found.py` does), then, one signal at a time: create a sink signal,
deliver one matching email over SMTP, long poll it until `found`. The client
notes its own wall clock at each step; afterwards the database gives the
server's side of the same signals, on the same clock (one machine):

    250 answered ─▶ push look began ─▶ found written ─▶ long poll answered
                    (checks.started_at)  (checks.finished_at,
                                          the write's transaction start)

and prints the median and p90 of each segment, with the first look (made by
the API after the create's answer) beside them. Signals whose first look
found the mail (it arrived before the look) are counted apart. A benchmark
prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import smtplib
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine  # the sibling helpers, importable once bench/ is on the path
import _stack
from _stack import HOST, percentile


@dataclass
class Steps:
    """The client's wall clock (epoch seconds) at each step of one signal."""

    signal_id: str
    created: float  # the create answered
    smtp_began: float  # connected, before MAIL FROM
    accepted: float  # the sink answered 250 to DATA
    answered: float  # the long poll answered
    result: str


def one(api: httpx.Client, smtp_port: int, run_id: str, n: int) -> Steps:
    recipient = f"user+{run_id}-{n}@example.test"
    marker = uuid.uuid4().hex[:12]
    response = api.post(
        "/v1/signals",
        json={
            "run_id": run_id,
            "test_case": f"case-{n}",
            "recipient": recipient,
            "subject_contains": marker,
            "expires_in_seconds": 120,
        },
    )
    response.raise_for_status()
    created = time.time()
    signal_id = response.json()["signal_id"]
    msg = EmailMessage()
    msg["From"], msg["To"] = "app@example.test", recipient
    msg["Subject"] = f"Verify your address ({marker})"
    msg["X-Signalbox-Run"] = run_id
    msg.set_content(f"Your code is 482913. https://example.test/verify?m={marker}")
    with smtplib.SMTP(HOST, smtp_port, timeout=10) as smtp:
        smtp_began = time.time()
        smtp.send_message(msg)
        accepted = time.time()
    view = api.get(f"/v1/signals/{signal_id}", params={"wait": 30})
    answered = time.time()
    view.raise_for_status()
    return Steps(signal_id, created, smtp_began, accepted, answered, view.json()["result"])


def server_side(database_url: str, steps: list[Steps]) -> dict[str, dict[str, float]]:
    """Per signal: each check's start and end by reason (epoch seconds), and found_at."""
    import psycopg

    ids = [s.signal_id for s in steps]
    out: dict[str, dict[str, float]] = {i: {} for i in ids}
    with psycopg.connect(database_url) as conn:
        for signal_id, found_at in conn.execute(
            "SELECT id, extract(epoch FROM found_at) FROM signals WHERE id = ANY(%s)", [ids]
        ):
            if found_at is not None:
                out[signal_id]["found_at"] = float(found_at)
        for signal_id, reason, outcome, began, ended in conn.execute(
            "SELECT signal_id, reason, outcome, extract(epoch FROM started_at),"
            " extract(epoch FROM finished_at) FROM checks WHERE signal_id = ANY(%s)"
            " ORDER BY signal_id, fence",
            [ids],
        ):
            out[signal_id].setdefault(f"{reason}_began", float(began))
            out[signal_id].setdefault(f"{reason}_ended", float(ended))
            out[signal_id].setdefault(f"{reason}_outcome", outcome)
    return out


def report(steps: list[Steps], server: dict[str, dict[str, float]]) -> None:
    pushed = [
        (s, server[s.signal_id])
        for s in steps
        if s.result == "found" and "push_began" in server[s.signal_id]
    ]
    first_found = sum(1 for s in steps if server[s.signal_id].get("first_outcome") == "matched")
    segments = {
        "250 -> push look began": [d["push_began"] - s.accepted for s, d in pushed],
        "push look: began -> found written": [d["push_ended"] - d["push_began"] for s, d in pushed],
        "found written -> long poll answered": [s.answered - d["push_ended"] for s, d in pushed],
        "250 -> long poll answered (all)": [s.answered - s.accepted for s, _ in pushed],
        "SMTP connect -> 250": [s.accepted - s.smtp_began for s, _ in pushed],
        "create answered -> first look began": [
            d["first_began"] - s.created for s, d in pushed if "first_began" in d
        ],
        "first look: began -> written": [
            d["first_ended"] - d["first_began"] for s, d in pushed if "first_began" in d
        ],
    }
    print()
    print("delivery -> found, one signal at a time: the client's and the database's clocks")
    print(
        f"  signals      {len(steps)} measured; {len(pushed)} found by the push look, "
        f"{first_found} by their first look (not in the segments)"
    )
    width = max(len(name) for name in segments)
    print(f"  {'segment':<{width}}  {'p50 ms':>7}  {'p90 ms':>7}")
    for name, values in segments.items():
        if not values:
            continue
        ordered = sorted(values)
        print(
            f"  {name:<{width}}  {statistics.median(ordered) * 1000:7.2f}"
            f"  {percentile(ordered, 90) * 1000:7.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=100, help="measured signals (100)")
    parser.add_argument("--warmup", type=int, default=20, help="signals not measured (20)")
    args = parser.parse_args()
    if args.signals < 1 or args.warmup < 0:
        parser.error("--signals must be at least 1, --warmup at least 0")
    print("starting signalbox-server up --no-flower on embedded PostgreSQL and Redis ...")
    with _stack.running_stack(flower=False) as stack:
        api = httpx.Client(
            base_url=stack.api_url,
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=httpx.Timeout(45, connect=5),
        )
        run_id = f"bench-{uuid.uuid4().hex[:10]}"
        try:
            for n in range(args.warmup):
                one(api, stack.smtp_port, run_id, n)
            steps = [
                one(api, stack.smtp_port, run_id, args.warmup + n) for n in range(args.signals)
            ]
        finally:
            api.close()
        server = server_side(stack.database_url(), steps)
        machine = "machine\n" + _machine.render(
            _machine.describe(stack.database_url(), stack.redis_url)
        )
    report(steps, server)
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
