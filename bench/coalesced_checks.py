"""Provider calls per found signal: 200 signals waiting on one MailDev mailbox.

Starts embedded PostgreSQL and Redis, a real MailDev (from
scripts/install-test-deps.sh), and `signalbox-server up` with a `catcher`
provider. Creates N signals (different recipients) on that one mailbox, then
delivers their emails to MailDev over SMTP at a steady pace (no push: the
workers find them by polling). When all are found it prints the provider
calls Signalbox made (one per coalesced check, counted from the `checks`
table's batch ids) beside what per-signal pollers would have made:

- the same backoff schedule, one call per signal per check;
- a fixed 1-second poller per signal.

    uv run python bench/coalesced_checks.py [--signals 200] [--spread 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import smtplib
import subprocess
import sys
import tempfile
import time
import uuid
from email.message import EmailMessage
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._machine import describe, render  # noqa: E402
from tests.servers import free_port, maildev_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument(
        "--spread", type=float, default=20.0, help="seconds over which mail arrives"
    )
    parser.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args()

    from app.infra.embedded import ensure_services

    data = Path(tempfile.mkdtemp(prefix="sbx-bench-coalesce-"))
    services = ensure_services(
        database_url=None, broker_url=None, data_dir=data, redis_port=free_port()
    )
    token = "bench-token-" + uuid.uuid4().hex
    api_port, smtp_port = free_port(), free_port()
    proc: subprocess.Popen[bytes] | None = None
    with maildev_server(data / "maildev") as maildev:
        (data / "providers.toml").write_text(
            f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n'
        )
        env = {
            **os.environ,
            "SIGNALBOX_DATABASE_URL": services.database_url or "",
            "SIGNALBOX_BROKER_URL": services.redis_url or "",
            "SIGNALBOX_DATA_DIR": str(data),
            "SIGNALBOX_PROVIDERS_FILE": str(data / "providers.toml"),
            "SIGNALBOX_API_TOKENS": f"bench:{token}",
            "SIGNALBOX_API_PORT": str(api_port),
            "SIGNALBOX_SMTP_PORT": str(smtp_port),
            "SIGNALBOX_LOG_LEVEL": "WARNING",
        }
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "up", "--no-flower"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            base = f"http://127.0.0.1:{api_port}"
            _wait(lambda: _ok(base + "/healthz"), 60)
            run(args, base, token, maildev, services.database_url or "")
        finally:
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    services.stop()
    return 0


def run(args: argparse.Namespace, base: str, token: str, maildev: object, db_url: str) -> None:
    run_id = "bench-" + uuid.uuid4().hex[:8]
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as api:
        ids: dict[str, str] = {}
        for i in range(args.signals):
            recipient = f"user{i}-{run_id}@example.test"
            r = api.post(
                "/v1/signals",
                json={
                    "run_id": run_id,
                    "test_case": f"case-{i}",
                    "recipient": recipient,
                    "provider": "catcher",
                    "expires_in_seconds": int(args.timeout),
                    "max_checks": 10000,
                },
            )
            r.raise_for_status()
            ids[recipient] = r.json()["signal_id"]
        started = time.monotonic()
        pace = args.spread / max(1, args.signals)
        with smtplib.SMTP("127.0.0.1", maildev.smtp_port, timeout=10) as smtp:  # type: ignore[attr-defined]
            for recipient in ids:
                msg = EmailMessage()
                msg["From"], msg["To"], msg["Subject"] = "app@example.test", recipient, "Welcome"
                msg.set_content("hello")
                smtp.send_message(msg)
                time.sleep(pace)
        with psycopg.connect(db_url) as conn:
            _wait(
                lambda: (
                    conn.execute("SELECT count(*) FROM signals WHERE status = 'found'").fetchone()[
                        0
                    ]
                    == args.signals
                ),
                args.timeout,
            )
            elapsed = time.monotonic() - started
            calls, checks = conn.execute(
                "SELECT count(DISTINCT batch_id), count(*) FROM checks"
                " WHERE outcome <> 'circuit_open'"
            ).fetchone()
            waited = conn.execute(
                "SELECT coalesce(sum(extract(epoch FROM found_at - created_at)), 0) FROM signals"
            ).fetchone()[0]
    found = args.signals
    fixed = float(waited)  # a 1 s poller calls once per second waited
    print("machine")
    print(render(describe(db_url)))
    rows = [
        ("signals waiting on one MailDev mailbox", f"{found}"),
        ("mail spread over", f"{args.spread:.0f} s; all found in {elapsed:.1f} s"),
        ("provider calls (coalesced checks)", f"{calls}  ({calls / found:.2f} per found signal)"),
        ("per-signal poller, same backoff", f"{checks}  ({checks / found:.2f} per found signal)"),
        ("per-signal poller, every 1 s", f"{fixed:.0f}  ({fixed / found:.2f} per found signal)"),
    ]
    for label, value in rows:
        print(f"{label:<40}: {value}")


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout} s")
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
