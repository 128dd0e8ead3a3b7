"""The dead-letter webhook: every new dead letter POSTed once, signed, retried
with backoff through a receiver's failures, never lost, never sent twice."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.helpers import db_rows, db_scalar
from tests.servers import free_port
from tests.servers.webhook_receiver import Receiver
from tests.stack import ROOT, Stack, wait_until

pytestmark = pytest.mark.integration

SECRET = "whsec-test-0123456789"
FIELDS = {
    "dead_letter_id",
    "namespace",
    "signal_id",
    "run_id",
    "test_case",
    "reason",
    "provider",
    "recommendation",
}


def webhook_stack(stack_factory: Callable[..., Stack], url: str, **extra: str) -> Stack:
    stack = stack_factory(
        {
            "SIGNALBOX_DEAD_LETTER_WEBHOOK_URL": url,
            "SIGNALBOX_DEAD_LETTER_WEBHOOK_SECRET": SECRET,
            "SIGNALBOX_WEBHOOK_BACKOFF_BASE_SECONDS": "0.3",
            "SIGNALBOX_WEBHOOK_BACKOFF_CAP_SECONDS": "1",
            "SIGNALBOX_WEBHOOK_POLL_SECONDS": "0.3",
            # Generous: a receiver that answers late on a loaded machine must
            # not count as a timed-out (and retried) attempt. The backoff keeps
            # the tests fast; no receiver here is meant to be slow.
            "SIGNALBOX_WEBHOOK_TIMEOUT_SECONDS": "60",
            **extra,
        }
    )
    # No SMTP sink: these dead letters come from deadlines alone.
    return stack.start(smtp=False)


def verified_time(headers: dict[str, str], body: bytes) -> int:
    """What docs/api.md tells a receiver to do: recompute the HMAC over
    "<t>.<raw body>" and compare in constant time. Returns `t`."""
    fields = dict(part.split("=", 1) for part in headers["X-Signalbox-Signature"].split(","))
    assert set(fields) == {"t", "v1"}
    signed = fields["t"].encode() + b"." + body
    expected = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, fields["v1"])
    return int(fields["t"])


def dead_letter(stack: Stack, subject: str = "Your code 493817") -> dict:
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={
                "run_id": f"run-{uuid.uuid4().hex[:8]}",
                "test_case": "test_signup_sends_code",
                "recipient": f"user-{uuid.uuid4().hex[:6]}@example.test",
                "subject_contains": subject,
                "expires_in_seconds": 1,
            },
        ).json()
    return wait_until(
        lambda: db_rows(
            stack,
            "SELECT id, namespace, signal_id, run_id, reason, provider, recommendation"
            " FROM dead_letters WHERE signal_id = %s",
            signal["signal_id"],
        ),
        20,
        what="the dead letter",
    )[0]


# Each starts a stack of its own (API, worker, beat): slow on a loaded machine.
@pytest.mark.timeout(300)
def test_a_dead_letter_is_delivered_once_signed_after_two_failures(
    stack_factory: Callable[..., Stack], receiver: Receiver
) -> None:
    started = int(time.time())
    stack = webhook_stack(stack_factory, receiver.url)
    first = dead_letter(stack)
    wait_until(lambda: receiver.delivered(), 40, what="a successful delivery")
    # A second dead letter delivered later proves polls went on after the first.
    second = dead_letter(stack)
    wait_until(lambda: len(receiver.delivered()) == 2, 40, what="the second delivery")

    delivered = receiver.delivered()
    assert [d["dead_letter_id"] for d in delivered] == [first[0], second[0]]
    assert [r[2] for r in receiver.requests] == [500, 500, 200, 200]
    payload = delivered[0]
    assert set(payload) == FIELDS
    assert payload["test_case"] == "test_signup_sends_code"
    assert payload["reason"] == "deadline" and payload["namespace"] == "default"
    assert "493817" not in json.dumps(payload)  # neither subject nor code
    stamps = []
    for headers, body, _ in receiver.requests:
        stamps.append(verified_time(headers, body))
        assert headers["Content-Type"] == "application/json"
    # Each attempt is signed at its own time, within this test's run.
    assert started <= stamps[0] <= stamps[1] <= stamps[2] <= int(time.time())
    assert "webhook_unsigned" not in stack.log_text()  # it has a secret
    # The three attempts of the first carried the same bytes.
    assert len({r[1] for r in receiver.requests[:3]}) == 1

    # The receiver answered before the worker wrote the outcome: wait for the write.
    def written() -> list | None:
        rows = db_rows(
            stack,
            "SELECT dead_letter_id, state, attempts, last_status, delivered_at IS NOT NULL"
            " FROM webhook_deliveries ORDER BY id",
        )
        return rows if all(r[1] == "delivered" for r in rows) else None

    rows = wait_until(written, 20, what="both outcomes written")
    assert rows == [(first[0], "delivered", 3, 200, True), (second[0], "delivered", 1, 200, True)]
    metrics = httpx.get(f"{stack.api_url}/metrics").text
    assert 'signalbox_webhook_deliveries_total{outcome="delivered"} 2.0' in metrics
    assert 'signalbox_webhook_deliveries_total{outcome="failed"} 2.0' in metrics


@pytest.mark.timeout(300)
def test_a_receiver_that_is_down_gets_retries_then_the_delivery_gives_up(
    stack_factory: Callable[..., Stack],
) -> None:
    # Nothing listens on this port; the retry horizon is 5.4 s (past it, three attempts at least).
    url = f"http://127.0.0.1:{free_port()}/down"
    stack = webhook_stack(stack_factory, url, SIGNALBOX_WEBHOOK_RETRY_HOURS="0.0015")
    dl = dead_letter(stack)
    wait_until(
        lambda: db_scalar(stack, "SELECT attempts FROM webhook_deliveries") >= 3,
        40,
        what="several attempts",
    )
    wait_until(
        lambda: db_scalar(stack, "SELECT state FROM webhook_deliveries") == "failed",
        40,
        what="the delivery to give up",
    )
    state, attempts, error, delivered_at = db_rows(
        stack,
        "SELECT state, attempts, last_error, delivered_at FROM webhook_deliveries"
        " WHERE dead_letter_id = %s",
        dl[0],
    )[0]
    assert state == "failed" and delivered_at is None
    assert error == "ConnectError" and url not in error
    # Another dead letter's delivery is attempted later: the given-up one is not retried.
    other = dead_letter(stack)
    wait_until(
        lambda: (
            db_scalar(
                stack, "SELECT attempts FROM webhook_deliveries WHERE dead_letter_id = %s", other[0]
            )
            >= 2
        ),
        40,
        what="the other delivery's attempts",
    )
    assert (
        db_scalar(stack, "SELECT attempts FROM webhook_deliveries WHERE dead_letter_id = %s", dl[0])
        == attempts
    )
    metrics = httpx.get(f"{stack.api_url}/metrics").text
    assert 'signalbox_webhook_deliveries_total{outcome="gave_up"} 1.0' in metrics


def test_no_delivery_is_queued_when_no_webhook_is_configured(stack: Stack) -> None:
    dead_letter(stack)
    assert db_scalar(stack, "SELECT count(*) FROM webhook_deliveries") == 0


@pytest.mark.timeout(300)
def test_worker_and_beat_warn_at_start_when_the_webhook_has_no_secret(
    stack_factory: Callable[..., Stack], receiver: Receiver
) -> None:
    stack = webhook_stack(stack_factory, receiver.url, SIGNALBOX_DEAD_LETTER_WEBHOOK_SECRET="")
    for part in ("worker", "beat"):
        wait_until(
            lambda part=part: "webhook_unsigned" in stack.log_text(part),
            60,
            what=f"the {part}'s unsigned-webhook warning",
        )
        assert stack.log_text(part).count("webhook_unsigned") == 1
        assert receiver.url not in stack.log_text(part)  # the URL may carry a secret
    # Delivered all the same, with no signature header.
    dead_letter(stack)
    wait_until(lambda: receiver.delivered(), 40, what="an unsigned delivery")
    assert all("X-Signalbox-Signature" not in headers for headers, _, _ in receiver.requests)


@pytest.mark.parametrize("secret", ["", "whsec-k"])
def test_up_warns_on_stderr_at_start_when_the_webhook_has_no_secret(
    tmp_path: Path, secret: str
) -> None:
    # `up` warns before anything else it does; a taken API port then stops it
    # right there, so no embedded server has to start for this.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    url = "http://127.0.0.1:9/hooks?key=url-secret"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        env.update(
            SIGNALBOX_DATA_DIR=str(tmp_path / "data"),
            SIGNALBOX_API_PORT=str(holder.getsockname()[1]),
            SIGNALBOX_DEAD_LETTER_WEBHOOK_URL=url,
            SIGNALBOX_DEAD_LETTER_WEBHOOK_SECRET=secret,
        )
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "up"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and "SIGNALBOX_API_PORT" in lines[-1], result.stderr
    warnings = [line for line in lines if "SECRET is empty" in line]
    assert len(warnings) == (0 if secret else 1), result.stderr
    assert "url-secret" not in result.stderr
