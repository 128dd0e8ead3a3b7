"""A claim that took nothing, classified once on the claim statement's
facts (app.domain.claiming)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from app.domain.claiming import (
    ClaimFacts,
    ConsumeRefusal,
    Refusal,
    claim_refusal,
    consume_refusal,
)
from app.domain.expectations import Expect
from app.domain.states import Status

FOUND = ClaimFacts(exists=True, status=Status.FOUND)


def test_no_signal_is_not_found_and_another_run_is_a_mismatch() -> None:
    assert claim_refusal(ClaimFacts(exists=False)) is Refusal.NOT_FOUND
    assert claim_refusal(replace(FOUND, run_matches=False)) is Refusal.RUN_MISMATCH


def test_a_found_signal_with_a_claim_left_raced_and_the_statement_runs_again() -> None:
    assert claim_refusal(FOUND) is Refusal.RACED


def test_a_found_signal_whose_message_was_deleted_by_hand_has_none() -> None:
    assert claim_refusal(replace(FOUND, has_message=False)) is Refusal.NO_MESSAGE


def test_a_claimed_signal_under_a_lapsed_lease_is_lapsed_then_claimed_again() -> None:
    claimed = replace(FOUND, status=Status.CLAIMED)
    assert claim_refusal(replace(claimed, lease_lapsed=True)) is Refusal.LEASE_LAPSED
    assert claim_refusal(claimed) is Refusal.ALREADY_CLAIMED


def test_each_state_answers_its_own_refusal() -> None:
    assert claim_refusal(replace(FOUND, status=Status.WAITING)) is Refusal.WAITING
    assert claim_refusal(replace(FOUND, status=Status.EXPIRED)) is Refusal.EXPIRED
    assert claim_refusal(replace(FOUND, status=Status.CONSUMED)) is Refusal.ALREADY_CONSUMED
    assert claim_refusal(replace(FOUND, status=Status.CANCELLED)) is Refusal.NOT_CLAIMABLE
    assert claim_refusal(replace(FOUND, claims_left=False)) is Refusal.ALREADY_CLAIMED


def test_a_signal_expecting_no_email_is_never_claimable() -> None:
    for status in (Status.WAITING, Status.ABSENT, Status.ARRIVED):
        facts = replace(FOUND, status=status, expect=Expect.NONE)
        assert claim_refusal(facts) is Refusal.NOT_CLAIMABLE


@given(
    exists=st.booleans(),
    run_matches=st.booleans(),
    status=st.sampled_from(list(Status)),
    expect=st.sampled_from(list(Expect)),
    has_message=st.booleans(),
    claims_left=st.booleans(),
    lease_lapsed=st.booleans(),
)
def test_a_refusal_retries_only_when_the_signal_could_still_be_claimed_now(
    exists: bool,
    run_matches: bool,
    status: Status,
    expect: Expect,
    has_message: bool,
    claims_left: bool,
    lease_lapsed: bool,
) -> None:
    facts = ClaimFacts(exists, run_matches, status, expect, has_message, claims_left, lease_lapsed)
    got = claim_refusal(facts)
    retries = got in (Refusal.RACED, Refusal.LEASE_LAPSED)
    claimable_now = (
        exists
        and run_matches
        and (
            (status is Status.FOUND and has_message and claims_left and expect is not Expect.NONE)
            or (status is Status.CLAIMED and lease_lapsed)
        )
    )
    assert retries == claimable_now


def test_a_consume_that_wrote_nothing_returns_the_receipt_refuses_or_runs_again() -> None:
    assert consume_refusal("consumed", False, False) is ConsumeRefusal.CONSUMED
    assert consume_refusal("active", True, True) is ConsumeRefusal.RACED
    for state, live, current in (
        ("active", False, True),
        ("active", True, False),
        ("released", True, True),
        ("lapsed", False, True),
        (None, False, False),
    ):
        assert consume_refusal(state, live, current) is ConsumeRefusal.LAPSED
