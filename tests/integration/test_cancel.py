"""POST /v1/signals/{id}/cancel on the real stack: the `cancelled` state is
final, ends an active claim, writes no dead letter, wakes the long poll and
shows in the evidence and the timeline with its reason."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.helpers import create_signal, db_scalar, mail, signal_view, wait_result
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


def cancel(stack: Stack, signal_id: str, reason: Any = "test_failed", token: str | None = None):
    with stack.client(token) as api:
        return api.post(f"/v1/signals/{signal_id}/cancel", json={"reason": reason})


def found(stack: Stack) -> dict[str, Any]:
    signal = create_signal(stack, expires_in_seconds=60)
    stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"])
    assert view["status"] == "found", view
    return view


def test_a_waiting_signal_is_cancelled_with_its_reason_and_no_dead_letter(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=2, max_checks=3)
    r = cancel(stack, signal["signal_id"], "test_failed")
    assert r.status_code == 200, r.text
    view = r.json()
    assert (view["status"], view["result"]) == ("cancelled", "cancelled")
    assert view["cancellation"]["reason"] == "test_failed"
    assert view["cancellation"]["cancelled_at"].endswith("Z")
    assert view["retry_after_seconds"] is None
    # Past its deadline, the sweep neither expires it nor writes a dead letter.
    time.sleep(3.5)
    assert signal_view(stack, signal["signal_id"])["status"] == "cancelled"
    assert db_scalar(stack, "SELECT count(*) FROM dead_letters") == 0
    # Mail arriving now matches nothing: the signal stays cancelled, without a message.
    stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])
    time.sleep(1)
    after = signal_view(stack, signal["signal_id"])
    assert after["status"] == "cancelled" and after["message"] is None


def test_cancelling_again_answers_the_same_view_and_keeps_the_first_reason(stack: Stack) -> None:
    signal = create_signal(stack)
    first = cancel(stack, signal["signal_id"], "test_ended").json()
    again = cancel(stack, signal["signal_id"], "something else")
    assert again.status_code == 200
    assert again.json() == first


def test_a_claimed_signal_is_cancelled_its_claim_ended_and_consume_refused(stack: Stack) -> None:
    view = found(stack)
    with stack.client() as api:
        claim = api.post(
            f"/v1/signals/{view['signal_id']}/claim", json={"run_id": view["run_id"]}
        ).json()
    assert claim["status"] == "claimed"
    r = cancel(stack, view["signal_id"])
    assert r.status_code == 200, r.text
    cancelled = r.json()
    assert cancelled["status"] == "cancelled" and cancelled["claim"] is None
    assert cancelled["message"]["message_id"] == view["message"]["message_id"]
    assert (
        db_scalar(stack, "SELECT state FROM claims WHERE id = %s", claim["claim_id"]) == "cancelled"
    )
    with stack.client() as api:
        consume = api.post(f"/v1/claims/{claim['claim_id']}/consume")
        again = api.post(f"/v1/signals/{view['signal_id']}/claim", json={"run_id": view["run_id"]})
    assert consume.status_code == 409 and consume.json()["error"]["code"] == "lease_expired"
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_claimable"
    assert db_scalar(stack, "SELECT count(*) FROM dead_letters") == 0


def test_a_found_signal_is_cancelled(stack: Stack) -> None:
    view = found(stack)
    r = cancel(stack, view["signal_id"], "test_ended")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_an_ended_signal_is_not_cancellable(stack: Stack) -> None:
    view = found(stack)
    with stack.client() as api:
        claim = api.post(
            f"/v1/signals/{view['signal_id']}/claim", json={"run_id": view["run_id"]}
        ).json()
        assert api.post(f"/v1/claims/{claim['claim_id']}/consume").status_code == 200
    r = cancel(stack, view["signal_id"])
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "not_cancellable"
    assert signal_view(stack, view["signal_id"])["status"] == "consumed"


@pytest.mark.parametrize("reason", ["", "x" * 201, "two\nlines", "   ", None, 7])
def test_a_bad_reason_is_a_422_naming_it_and_changes_nothing(stack: Stack, reason: Any) -> None:
    signal = create_signal(stack)
    r = cancel(stack, signal["signal_id"], reason)
    assert r.status_code == 422, r.text
    assert "reason" in r.text
    assert signal_view(stack, signal["signal_id"])["status"] == "waiting"


def test_another_namespace_cannot_cancel_and_an_unknown_id_is_404(stack: Stack) -> None:
    signal = create_signal(stack)
    assert cancel(stack, signal["signal_id"], token=TOKENS["other"]).status_code == 404
    assert cancel(stack, "sig_" + uuid.uuid4().hex).status_code == 404
    assert signal_view(stack, signal["signal_id"])["status"] == "waiting"


def test_a_long_poll_answers_when_its_signal_is_cancelled(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=60)
    answered: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        with httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=40
        ) as api:
            answered["view"] = api.get(
                f"/v1/signals/{signal['signal_id']}", params={"wait": 30}
            ).json()
        answered["seconds"] = time.monotonic() - started

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.7)
    assert cancel(stack, signal["signal_id"]).status_code == 200
    waiter.join(35)
    assert answered["view"]["status"] == "cancelled"
    assert answered["seconds"] < 5


def test_evidence_shows_the_cancellation_with_its_reason(stack: Stack) -> None:
    signal = create_signal(stack)
    cancel(stack, signal["signal_id"], "test_failed")
    with stack.client() as api:
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence").json()
    entry = evidence["signals"][0]
    assert entry["status"] == "cancelled"
    assert entry["cancellation"]["reason"] == "test_failed"
    assert entry["timings"]["cancelled_at"] == entry["cancellation"]["cancelled_at"]
    assert entry["dead_letter"] is None
    assert evidence["summary"]["by_status"] == {"cancelled": 1}


def test_the_console_timeline_ends_with_the_cancellation_and_its_reason(stack: Stack) -> None:
    from tests.integration.test_triage_console import sign_in

    view = found(stack)
    with stack.client() as api:
        api.post(f"/v1/signals/{view['signal_id']}/claim", json={"run_id": view["run_id"]})
    cancel(stack, view["signal_id"], "test_failed")
    with sign_in(stack.api_url, TOKENS["default"]) as console:
        page = console.get(f"/console/signals/{view['signal_id']}").text
    timeline = page.split("claim cancelled")[1] if "claim cancelled" in page else ""
    assert "reason test_failed; no dead letter" in timeline, page
