"""The Python client's assertions against the running stack: expect_none,
expect_exactly_one, matches() and the claim's owner."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from live_helpers import new_run_id, send_email
from signalbox import AlreadyClaimed, EmailArrived, NotClaimable, Signalbox, SignalExpired

pytestmark = pytest.mark.acceptance


@pytest.fixture
def sb(live_stack: Any) -> Iterator[Signalbox]:
    with Signalbox(live_stack.api_url, live_stack.token) as client:
        yield client


def test_expect_none_returns_absent_after_the_deadline(sb: Signalbox) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.expect_none(run_id, "test_quiet", box.address, expires_in_seconds=2)

    signal = handle.wait(timeout=60)

    assert (signal.result, signal.expect) == ("absent", "none")
    with pytest.raises(NotClaimable):
        handle.claim()


def test_expect_none_raises_email_arrived_when_one_comes(sb: Signalbox, live_stack: Any) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.expect_none(run_id, "test_no_reset", box.address, subject_contains="Reset")
    send_email(live_stack, box.address, "Reset your password", "Open the link", run_id)

    with pytest.raises(EmailArrived) as caught:
        handle.wait(timeout=60)

    assert isinstance(caught.value, AssertionError)
    assert caught.value.signal is not None and caught.value.signal.message is not None
    assert caught.value.recommendation and handle.signal.result == "arrived"


def test_expect_exactly_one_with_two_mails_raises_duplicate_messages(
    sb: Signalbox, live_stack: Any
) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.expect_exactly_one(run_id, "test_once", box.address, settle_seconds=5)
    send_email(live_stack, box.address, "Verify", "one", run_id)
    time.sleep(0.3)
    send_email(live_stack, box.address, "Verify", "two", run_id)

    with pytest.raises(SignalExpired) as caught:
        handle.wait(timeout=60)

    assert caught.value.reason == "duplicate_messages"
    dead = caught.value.dead_letter
    assert dead is not None and dead.duplicates is not None
    ids = [m.message_id for m in handle.matches()]
    assert [m["message_id"] for m in dead.duplicates["messages"]] == ids


def test_exactly_one_found_claims_with_an_owner_everywhere(sb: Signalbox, live_stack: Any) -> None:
    run_id = new_run_id()
    box = sb.mailbox(run_id)
    handle = sb.expect_exactly_one(run_id, "test_one", box.address, settle_seconds=1)
    send_email(live_stack, box.address, "Verify", "only one", run_id)

    found = handle.wait(timeout=60)

    assert found.result == "found" and found.settle_seconds == 1
    (match,) = handle.matches()
    assert match.taken_by == handle.signal_id
    lease = handle.claim(owner="pod-7")
    assert lease.claim.owner == "pod-7"
    with pytest.raises(AlreadyClaimed) as caught:
        handle.claim(owner="pod-8")
    assert caught.value.owner == "pod-7"
    assert sb.get_signal(handle.signal_id).claim.owner == "pod-7"  # type: ignore[union-attr]
    assert lease.consume().owner == "pod-7"
