"""The create's refusals, decided once on the create statement's facts
(app.domain.admission), and the outcomes a create answers with."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.domain.admission import (
    Admission,
    CreateFacts,
    CreateOutcome,
    admission,
    conflicting_fields,
    hold_lapse,
    replay_outcome,
)
from app.domain.states import Status

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
HOLD = timedelta(hours=24)
CLEAR = CreateFacts(
    now=NOW,
    received_after=None,
    in_window=True,
    owner_ok=True,
    under_bound=True,
    needs_hold=True,
    holder=None,
    key_signal=None,
    counted_exactly=False,
)


def test_a_create_whose_checks_all_cleared_but_inserted_nothing_raced_and_runs_again() -> None:
    assert admission("ns-a", CLEAR) is Admission.RACED
    assert admission("ns-a", replace(CLEAR, holder="ns-a")) is Admission.RACED


def test_received_after_outside_the_window_is_too_early_or_too_late_by_its_side() -> None:
    early = replace(CLEAR, in_window=False, received_after=NOW - timedelta(days=3))
    late = replace(CLEAR, in_window=False, received_after=NOW + timedelta(hours=3))
    assert admission("ns-a", early) is Admission.TOO_EARLY
    assert admission("ns-a", late) is Admission.TOO_LATE


def test_an_address_another_namespace_owns_is_refused_before_its_hold_or_key() -> None:
    facts = replace(CLEAR, owner_ok=False, holder="ns-b", key_signal="sig_1")
    assert admission("ns-a", facts) is Admission.NOT_OWNED


def test_another_namespaces_hold_is_judged_only_when_the_address_needs_one() -> None:
    assert admission("ns-a", replace(CLEAR, holder="ns-b")) is Admission.HELD_BY_OTHER
    # A mailbox's or a shared address needs no hold: a stale one is ignored.
    assert admission("ns-a", replace(CLEAR, holder="ns-b", needs_hold=False)) is Admission.RACED


def test_a_replay_is_never_refused_for_the_quota() -> None:
    facts = replace(CLEAR, key_signal="sig_1", under_bound=False, counted_exactly=True)
    assert admission("ns-a", facts) is Admission.EXISTING


def test_near_the_quota_a_create_counts_again_exactly_and_only_then_is_refused() -> None:
    near = replace(CLEAR, under_bound=False)
    assert admission("ns-a", near) is Admission.COUNT_EXACTLY
    assert admission("ns-a", replace(near, counted_exactly=True)) is Admission.TOO_MANY


@given(
    in_window=st.booleans(),
    owner_ok=st.booleans(),
    under_bound=st.booleans(),
    needs_hold=st.booleans(),
    holder=st.sampled_from([None, "ns-a", "ns-b"]),
    key_signal=st.sampled_from([None, "sig_1"]),
    counted_exactly=st.booleans(),
    early=st.booleans(),
)
def test_every_refusal_names_the_first_check_the_facts_fail(
    in_window: bool,
    owner_ok: bool,
    under_bound: bool,
    needs_hold: bool,
    holder: str | None,
    key_signal: str | None,
    counted_exactly: bool,
    early: bool,
) -> None:
    facts = CreateFacts(
        now=NOW,
        received_after=NOW + (timedelta(days=-3) if early else timedelta(hours=3)),
        in_window=in_window,
        owner_ok=owner_ok,
        under_bound=under_bound,
        needs_hold=needs_hold,
        holder=holder,
        key_signal=key_signal,
        counted_exactly=counted_exactly,
    )
    got = admission("ns-a", facts)
    held_elsewhere = needs_hold and holder == "ns-b"
    if not in_window:
        assert got in (Admission.TOO_EARLY, Admission.TOO_LATE)
    elif not owner_ok:
        assert got is Admission.NOT_OWNED
    elif held_elsewhere:
        assert got is Admission.HELD_BY_OTHER
    elif key_signal is not None:
        assert got is Admission.EXISTING
    elif not under_bound:
        assert got in (Admission.COUNT_EXACTLY, Admission.TOO_MANY)
        assert (got is Admission.TOO_MANY) == counted_exactly
    else:
        assert got is Admission.RACED


def test_a_hold_stands_while_its_namespace_has_a_live_signal_on_the_address() -> None:
    long_ago = NOW - timedelta(days=30)
    assert hold_lapse(long_ago, True, None, HOLD, NOW) is None


def test_a_hold_lapses_the_hold_period_after_its_last_signal_ended() -> None:
    ended = NOW - timedelta(hours=30)
    assert hold_lapse(NOW - timedelta(days=3), False, ended, HOLD, NOW) == ended + HOLD
    recent = NOW - timedelta(hours=1)
    assert hold_lapse(NOW - timedelta(days=3), False, recent, HOLD, NOW) is None


@given(
    held_hours_ago=st.floats(min_value=0, max_value=1000),
    ended_hours_ago=st.none() | st.floats(min_value=0, max_value=1000),
)
def test_a_lapsed_hold_is_released_at_a_moment_that_has_passed(
    held_hours_ago: float, ended_hours_ago: float | None
) -> None:
    held_from = NOW - timedelta(hours=held_hours_ago)
    last_end = None if ended_hours_ago is None else NOW - timedelta(hours=ended_hours_ago)
    lapses = hold_lapse(held_from, False, last_end, HOLD, NOW)
    if lapses is not None:
        assert held_from + HOLD <= lapses <= NOW


def test_conflicting_fields_name_each_field_that_differs_under_the_same_key() -> None:
    stored = {
        "recipient": "a@x.test",
        "test_case": "t",
        "subject_contains": None,
        "body_contains": None,
        "provider": "sink",
        "expect": "first",
        "settle_seconds": None,
    }
    assert conflicting_fields(stored, dict(stored)) == []
    other = {**stored, "recipient": "b@x.test", "provider": "imap"}
    assert conflicting_fields(stored, other) == ["recipient", "provider"]


def test_a_replay_answers_by_whether_its_signal_still_waits() -> None:
    assert replay_outcome(Status.WAITING) is CreateOutcome.EXISTING_WAITING
    for status in Status:
        if status is not Status.WAITING:
            assert replay_outcome(status) is CreateOutcome.EXISTING
