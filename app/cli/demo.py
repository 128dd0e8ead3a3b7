"""`signalbox-server demo`: one signal end to end against the running stack."""

from __future__ import annotations

import argparse
import smtplib
import time
import uuid
from email.message import EmailMessage

from app.cli.up import DEV_TOKEN_FILE
from app.settings import Settings, get_settings


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(get_settings())


def run_demo(settings: Settings) -> int:
    """Create a signal, send its email, wait for it, claim and consume it, and
    print each step; 1 if the email was not found, 2 without a token."""
    # Here, not at the top: every command imports this module for its parser.
    import httpx

    token = next(iter(settings.token_map), None)
    token_file = settings.data_dir / DEV_TOKEN_FILE
    if token is None and token_file.exists():
        token = token_file.read_text().strip()
    if not token:
        print("demo: no token; set SIGNALBOX_API_TOKENS or run `signalbox-server up` first")
        return 2
    base = f"http://{settings.api_host}:{settings.api_port}"
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    recipient = f"demo+{run_id}@example.test"
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=70
    ) as api:
        signal = (
            api.post(
                "/v1/signals",
                json={
                    "run_id": run_id,
                    "test_case": "demo",
                    "recipient": recipient,
                    "subject_contains": "verify",
                    "expires_in_seconds": 60,
                },
            )
            .raise_for_status()
            .json()
        )
        print(f"signal {signal['signal_id']} created for run {run_id}: {signal['result']}")
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = "app@example.test", recipient, "Please verify"
        msg["X-Signalbox-Run"] = run_id
        msg.set_content("Your code is 482913. Open https://example.test/verify?t=demo to finish.")
        started = time.monotonic()
        with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=10) as smtp:
            smtp.send_message(msg)
        view = api.get(f"/v1/signals/{signal['signal_id']}", params={"wait": 30}).json()
        print(f"result {view['result']} after {time.monotonic() - started:.2f} s")
        if view["result"] != "found":
            return 1
        claim = api.post(f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": run_id}).json()
        links, codes = len(claim["links"]), len(claim["codes"])
        print(f"claimed {claim['claim_id']}: {links} link(s), {codes} code(s)")
        receipt = api.post(f"/v1/claims/{claim['claim_id']}/consume").raise_for_status().json()
        print(f"consumed: receipt {receipt['receipt_id']}")
        evidence = api.get(f"/v1/runs/{run_id}/evidence").raise_for_status().json()
        print(f"evidence: {evidence['summary']}")
    return 0
