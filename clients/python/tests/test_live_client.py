"""The Python client against the running stack (API, SMTP sink, worker, beat)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from live_helpers import new_run_id, send_email
from signalbox import AlreadyClaimed, Signalbox, SignalExpired, Unauthorized

pytestmark = pytest.mark.acceptance


@pytest.fixture
def sb(live_stack: Any) -> Iterator[Signalbox]:
    with Signalbox(live_stack.api_url, live_stack.token) as client:
        yield client


def test_watch_wait_claim_consume_leaves_a_receipt_in_the_evidence(
    sb: Signalbox, live_stack: Any
) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.watch(run_id, "test_roundtrip", box.address, subject_contains="verify")
    assert handle.created and handle.signal.is_pending

    send_email(
        live_stack,
        box.address,
        "Please verify your account",
        "Open https://app.example.test/verify?t=abc123 or type 482913",
        run_marker=run_id,
    )
    found = handle.wait(timeout=60)
    assert found.result == "found"
    assert found.message is not None and found.message.subject == "Please verify your account"

    lease = handle.claim(lease_seconds=30)
    with lease as claim:
        assert claim.links == ("https://app.example.test/verify?t=abc123",)
        assert "482913" in claim.codes
    receipt = lease.receipt
    assert receipt is not None and receipt.signal_id == handle.signal_id
    assert receipt.evidence.run_marker == "matched"
    assert sb.consume(lease.claim_id).receipt_id == receipt.receipt_id  # consume is idempotent

    evidence = sb.evidence(run_id)
    assert receipt.receipt_id in evidence.receipt_ids()
    assert "abc123" not in str(evidence.raw) and "482913" not in str(evidence.raw)


def test_watch_is_idempotent_for_the_same_run_and_test_case(sb: Signalbox) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    first = sb.watch(run_id, "test_idem", box.address)
    again = sb.watch(run_id, "test_idem", box.address)
    assert again.signal_id == first.signal_id and not again.created


def test_signal_with_no_email_expires_with_the_deadline_diagnosis(sb: Signalbox) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.watch(run_id, "test_expiry", box.address, expires_in_seconds=2)
    with pytest.raises(SignalExpired) as info:
        handle.wait(timeout=60)
    assert info.value.reason == "deadline"
    assert info.value.recommendation
    assert handle.signal.result == "expired"


def test_second_claim_while_leased_returns_already_claimed(sb: Signalbox, live_stack: Any) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.watch(run_id, "test_double_claim", box.address)
    send_email(live_stack, box.address, "Your code", "Code: 771204", run_marker=run_id)
    handle.wait(timeout=60)
    lease = handle.claim(lease_seconds=60)
    with pytest.raises(AlreadyClaimed) as info:
        handle.claim()
    assert info.value.claim_id == lease.claim_id
    lease.release()
    assert sb.get_signal(handle.signal_id).result == "found"


def test_wrong_token_is_unauthorized(live_stack: Any) -> None:
    with Signalbox(live_stack.api_url, "not-a-token") as client, pytest.raises(Unauthorized):
        client.evidence("any-run")
