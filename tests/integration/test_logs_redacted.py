"""Logs of every process are JSON lines with ids and recipient hashes, and
never hold a body, a link, a code, a token or an address in clear."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from email.message import EmailMessage

import pytest

from app.infra import keys
from app.settings import load_settings
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def json_lines(text: str) -> list[dict]:
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"a log line is not JSON: {line[:300]!r}")
    return entries


def test_full_flow_logs_are_json_lines_without_content_or_addresses(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory().start()
    secret_token = "vt_" + uuid.uuid4().hex
    link = f"https://app.example.test/verify?token={secret_token}"
    code = "83" + str(uuid.uuid4().int)[:4]
    body_marker = "Bodytext" + uuid.uuid4().hex[:10]
    recipient = f"Alice.{uuid.uuid4().hex[:8]}@Example.test"
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    with stack.client() as api:
        created = api.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "signup",
                "recipient": recipient,
                "subject_contains": "verify",
            },
        )
        assert created.status_code == 201, created.text
        signal = created.json()
        doomed = api.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "never-sent",
                "recipient": f"bob-{recipient}",
                "expires_in_seconds": 2,
            },
        ).json()

        msg = EmailMessage()
        msg["From"] = "app@example.test"
        msg["To"] = recipient
        msg["Subject"] = "Verify your account"
        msg["X-Signalbox-Run"] = run_id
        msg.set_content(f"{body_marker}\nOpen {link}\nor type the code {code}.\n")
        stack.send(bytes(msg), [recipient])

        found = api.get(f"/v1/signals/{signal['signal_id']}", params={"wait": 20}).json()
        assert found["status"] == "found"
        claim = api.post(f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": run_id})
        assert claim.status_code == 200, claim.text
        # The content really went through the system (so its absence below means something).
        assert link in claim.json()["links"] and code in claim.json()["codes"]
        consumed = api.post(f"/v1/claims/{claim.json()['claim_id']}/consume")
        assert consumed.status_code == 200
        expired = api.get(f"/v1/signals/{doomed['signal_id']}", params={"wait": 20}).json()
        assert expired["status"] == "expired"

    wait_until(
        lambda: "dead_letter_alert" in stack.log_text("worker"),
        20,
        what="the dead letter alert in the worker log",
    )
    text = stack.log_text()

    for secret in (secret_token, link, code, body_marker, stack.token):
        assert secret not in text, f"{secret!r} leaked into the logs"
    assert recipient.lower() not in text.lower()
    assert f"bob-{recipient}".lower() not in text.lower()

    def recipient_hash(address: str) -> str:
        # Keyed with the stack's own key (kept in its data directory).
        deployment = load_settings(data_dir=stack.data_dir, recipient_hash_key="")
        return keys.recipient_hash(address, deployment)

    entries = json_lines(text)
    components = {e.get("component") for e in entries}
    assert {"api", "smtp", "worker", "beat"} <= components, components
    ours = [e for e in entries if e.get("signal_id") == signal["signal_id"]]
    events = {e.get("event") for e in ours}
    assert {"signal_created", "signal_found", "signal_claimed", "signal_consumed"} <= events, events
    assert all(e.get("run_id") == run_id for e in ours if e.get("event") != "check_requeued")
    assert any(e.get("recipient_hash") == recipient_hash(recipient) for e in ours)
    # The look's own line (its hash is made only for a line logged).
    found = [e for e in ours if e.get("event") == "signal_found"]
    assert found and all(e.get("recipient_hash") == recipient_hash(recipient) for e in found)
    received = [e for e in entries if e.get("event") == "sink_received"]
    assert any(recipient_hash(recipient) in e.get("recipient_hashes", []) for e in received)
    alerts = [e for e in entries if e.get("event") == "dead_letter_alert"]
    assert any(e.get("signal_id") == doomed["signal_id"] for e in alerts)
