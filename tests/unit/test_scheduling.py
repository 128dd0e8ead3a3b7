"""What follows a check: budget, provider errors, deadline, Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.backoff import BackoffPolicy
from app.domain.scheduling import Counters, after_check, first_check_delay
from app.domain.states import CheckOutcome, CheckReason, ExpiryReason

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
POLICY = BackoffPolicy(base_seconds=1.0, cap_seconds=30.0)


def counters(**kw: object) -> Counters:
    base = {
        "checks_count": 0,
        "max_checks": 30,
        "consecutive_errors": 0,
        "expires_at": NOW + timedelta(minutes=2),
    }
    base.update(kw)
    return Counters(**base)  # type: ignore[arg-type]


def step(c: Counters, outcome: CheckOutcome, retry_after: float | None = None, max_errors: int = 5):
    return after_check(
        c,
        outcome,
        now=NOW,
        retry_after=retry_after,
        policy=POLICY,
        max_provider_errors=max_errors,
        rand=0.5,
    )


def test_no_match_spends_budget_resets_errors_and_schedules_backoff() -> None:
    s = step(counters(checks_count=2, consecutive_errors=3), CheckOutcome.NO_MATCH)
    assert s.counts and s.consecutive_errors == 0 and s.expiry is None
    assert s.next_reason is CheckReason.SCHEDULED
    assert s.next_check_at > NOW


def test_last_check_of_the_budget_before_the_deadline_is_free_and_kept_for_it() -> None:
    s = step(counters(checks_count=29), CheckOutcome.NO_MATCH)
    assert not s.counts and s.expiry is None
    assert s.next_check_at == NOW + timedelta(minutes=2)


def test_a_failed_final_look_that_spends_the_last_check_expires_with_check_budget() -> None:
    deadline = NOW - timedelta(seconds=1)
    s = step(counters(checks_count=29, expires_at=deadline), CheckOutcome.PROVIDER_ERROR)
    assert s.counts and s.expiry is ExpiryReason.CHECK_BUDGET


def after_first(max_checks: int, *, pushes: bool, looked_at: datetime = NOW) -> object:
    return after_check(
        counters(max_checks=max_checks),
        CheckOutcome.NO_MATCH,
        reason=CheckReason.FIRST,
        looked_at=looked_at,
        now=looked_at,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
        pushes=pushes,
    )


@pytest.mark.parametrize("pushes", [True, False])
def test_a_budget_of_one_never_ends_the_wait_at_a_first_look(pushes: bool) -> None:
    """max_checks 1: a first look before the deadline is free, the one
    counted look is the deadline's, and it ends the signal by its deadline."""
    deadline = NOW + timedelta(minutes=2)
    s = after_first(1, pushes=pushes)
    assert not s.counts and s.expiry is None  # type: ignore[attr-defined]
    assert s.next_check_at == deadline  # type: ignore[attr-defined]
    at_deadline = after_first(1, pushes=pushes, looked_at=deadline)
    assert at_deadline.counts  # type: ignore[attr-defined]
    assert at_deadline.expiry is ExpiryReason.DEADLINE  # type: ignore[attr-defined]


def test_a_polled_provider_s_first_check_with_a_budget_of_one_is_at_the_deadline() -> None:
    assert first_check_delay(120.0, 1, pushes=False) == 120.0
    # A provider that pushes looks at once (free: a database query), and any
    # larger budget has a check to spare for the first look.
    assert first_check_delay(120.0, 1, pushes=True) == 0.0
    assert first_check_delay(120.0, 2, pushes=False) == 0.0


@given(
    max_checks=st.integers(1, 50),
    checks_count=st.integers(0, 50),
    before=st.floats(0.001, 3600),
    reason=st.sampled_from(list(CheckReason)),
    outcome=st.sampled_from(
        [CheckOutcome.NO_MATCH, CheckOutcome.PROVIDER_ERROR, CheckOutcome.CIRCUIT_OPEN]
    ),
    retry_after=st.one_of(st.none(), st.floats(0, 60)),
)
def test_no_budget_ends_a_wait_before_its_deadline(
    max_checks: int,
    checks_count: int,
    before: float,
    reason: CheckReason,
    outcome: CheckOutcome,
    retry_after: float | None,
) -> None:
    """Whatever the budget left, a look that began before the deadline
    never expires the signal by check budget, and never spends the last check."""
    deadline = NOW + timedelta(seconds=before)
    c = counters(checks_count=min(checks_count, max_checks - 1), max_checks=max_checks,
                 expires_at=deadline)  # fmt: skip
    s = after_check(
        c,
        outcome,
        reason=reason,
        looked_at=NOW,
        now=NOW,
        retry_after=retry_after,
        policy=POLICY,
        max_provider_errors=1000,
        rand=0.5,
    )
    assert s.expiry is None
    assert c.checks_count + int(s.counts) < max_checks


def test_circuit_open_spends_no_budget_and_keeps_the_error_count() -> None:
    s = step(counters(checks_count=29, consecutive_errors=2), CheckOutcome.CIRCUIT_OPEN)
    assert not s.counts and s.consecutive_errors == 2 and s.expiry is None


def test_consecutive_provider_errors_expire_with_provider_errors() -> None:
    s = step(counters(consecutive_errors=4), CheckOutcome.PROVIDER_ERROR, max_errors=5)
    assert s.consecutive_errors == 5
    assert s.expiry is ExpiryReason.PROVIDER_ERRORS
    assert s.next_reason is CheckReason.ERROR_RETRY


def test_rate_limited_answer_waits_retry_after_and_burns_nothing() -> None:
    s = step(counters(checks_count=29, consecutive_errors=4), CheckOutcome.PROVIDER_ERROR, 20.0)
    assert not s.counts and s.consecutive_errors == 4 and s.expiry is None
    assert s.next_check_at >= NOW + timedelta(seconds=20)


def test_check_after_the_deadline_expires_with_deadline() -> None:
    s = step(counters(expires_at=NOW - timedelta(seconds=1)), CheckOutcome.NO_MATCH)
    assert s.expiry is ExpiryReason.DEADLINE


def test_matched_has_no_next_step() -> None:
    with pytest.raises(ValueError):
        step(counters(), CheckOutcome.MATCHED)


@given(
    outcome=st.sampled_from(
        [CheckOutcome.NO_MATCH, CheckOutcome.PROVIDER_ERROR, CheckOutcome.CIRCUIT_OPEN]
    ),
    checks=st.integers(0, 100),
    errors=st.integers(0, 20),
    seconds_left=st.floats(0.1, 3600),
    retry_after=st.one_of(st.none(), st.floats(0, 7200)),
    rand=st.floats(0, 0.999),
)
def test_next_check_is_never_past_the_deadline(
    outcome: CheckOutcome,
    checks: int,
    errors: int,
    seconds_left: float,
    retry_after: float | None,
    rand: float,
) -> None:
    deadline = NOW + timedelta(seconds=seconds_left)
    s = after_check(
        counters(
            checks_count=checks, max_checks=200, consecutive_errors=errors, expires_at=deadline
        ),
        outcome,
        now=NOW,
        retry_after=retry_after,
        policy=POLICY,
        max_provider_errors=1000,
        rand=rand,
    )
    assert NOW <= s.next_check_at <= deadline


# --------------------------------------------------------------------------- budget by reason


@pytest.mark.parametrize("reason", [CheckReason.PUSH, CheckReason.REDRIVE])
def test_push_and_redrive_checks_never_spend_the_budget(reason: CheckReason) -> None:
    s = after_check(
        counters(checks_count=4, max_checks=5),
        CheckOutcome.NO_MATCH,
        reason=reason,
        now=NOW,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert not s.counts and s.expiry is None


@pytest.mark.parametrize(
    "reason",
    [CheckReason.FIRST, CheckReason.SCHEDULED, CheckReason.ERROR_RETRY, CheckReason.SWEEP],
)
def test_checks_the_schedule_asked_for_spend_the_budget(reason: CheckReason) -> None:
    s = after_check(
        counters(checks_count=3, max_checks=5),
        CheckOutcome.NO_MATCH,
        reason=reason,
        now=NOW,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert s.counts and s.expiry is None
    # The last one is the deadline's: it spends it there.
    deadline = NOW - timedelta(milliseconds=1)
    s = after_check(
        counters(checks_count=4, max_checks=5, expires_at=deadline),
        CheckOutcome.PROVIDER_ERROR,
        reason=reason,
        now=NOW,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert s.counts and s.expiry is ExpiryReason.CHECK_BUDGET


def test_eight_pushes_from_other_runs_leave_a_five_check_budget_whole() -> None:
    c = counters(checks_count=1, max_checks=5)
    for _ in range(8):
        s = after_check(
            c,
            CheckOutcome.NO_MATCH,
            reason=CheckReason.PUSH,
            now=NOW,
            retry_after=None,
            policy=POLICY,
            max_provider_errors=5,
            rand=0.5,
        )
        assert s.expiry is None
        c = counters(checks_count=c.checks_count + int(s.counts), max_checks=5)
    assert c.checks_count == 1


# --------------------------------------------------------------------------- the final look


def test_a_look_that_began_before_the_deadline_never_expires_it() -> None:
    deadline = NOW + timedelta(seconds=10)
    s = after_check(
        counters(expires_at=deadline),
        CheckOutcome.NO_MATCH,
        looked_at=deadline - timedelta(milliseconds=1),
        now=deadline + timedelta(seconds=5),  # the provider was slow
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert s.expiry is None
    assert s.next_check_at == deadline  # the final look is due at once


def test_a_final_look_that_failed_is_tried_again_after_the_deadline() -> None:
    deadline = NOW + timedelta(seconds=10)
    s = after_check(
        counters(expires_at=deadline),
        CheckOutcome.CIRCUIT_OPEN,
        looked_at=deadline,
        now=deadline + timedelta(milliseconds=5),
        retry_after=3.0,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert s.expiry is None
    assert s.next_check_at >= deadline + timedelta(seconds=3)


def test_a_look_that_began_at_the_deadline_expires_it() -> None:
    deadline = NOW + timedelta(seconds=10)
    s = after_check(
        counters(expires_at=deadline),
        CheckOutcome.NO_MATCH,
        looked_at=deadline,
        now=deadline + timedelta(milliseconds=40),
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert s.expiry is ExpiryReason.DEADLINE


def test_the_last_check_of_the_budget_is_kept_for_the_deadline() -> None:
    deadline = NOW + timedelta(minutes=10)
    s = after_check(
        counters(checks_count=3, max_checks=5, expires_at=deadline),
        CheckOutcome.NO_MATCH,
        now=NOW,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert s.counts and s.expiry is None
    assert s.next_check_at == deadline


@given(
    seconds=st.integers(1, 600),
    max_checks=st.integers(1, 40),
    pickup=st.lists(st.floats(0, 5), min_size=1, max_size=60),
    durations=st.lists(st.floats(0, 45), min_size=1, max_size=60),
    rands=st.lists(st.floats(0, 0.999), min_size=1, max_size=60),
    outcomes=st.lists(
        st.sampled_from(
            [CheckOutcome.NO_MATCH, CheckOutcome.NO_MATCH, CheckOutcome.PROVIDER_ERROR]
        ),
        min_size=1,
        max_size=60,
    ),
)
def test_whatever_the_schedule_and_clock_the_last_look_covers_the_deadline(
    seconds: int,
    max_checks: int,
    pickup: list[float],
    durations: list[float],
    rands: list[float],
    outcomes: list[CheckOutcome],
) -> None:
    """Simulate a signal through its checks with arbitrary worker pick-up
    delays and provider call durations: no check is scheduled past the
    deadline, and a signal that expires on its deadline had a look that began
    at or after it (so a mail stamped before the deadline was seen)."""
    deadline = NOW + timedelta(seconds=seconds)
    c = counters(max_checks=max_checks, expires_at=deadline)
    due, reason = NOW, CheckReason.FIRST
    for i in range(400):
        looked_at = due + timedelta(seconds=pickup[i % len(pickup)])
        now = looked_at + timedelta(seconds=durations[i % len(durations)])
        outcome = outcomes[i % len(outcomes)]
        s = after_check(
            c,
            outcome,
            reason=reason,
            looked_at=looked_at,
            now=now,
            retry_after=None,
            policy=POLICY,
            max_provider_errors=1000,
            rand=rands[i % len(rands)],
        )
        # Only a failed final look is tried again after the deadline.
        assert s.next_check_at <= deadline or (
            looked_at >= deadline and outcome is not CheckOutcome.NO_MATCH
        )
        if s.expiry is ExpiryReason.DEADLINE:
            assert looked_at >= deadline and outcome is CheckOutcome.NO_MATCH
            return
        if s.expiry is ExpiryReason.CHECK_BUDGET:
            # The last check of a budget is kept for the deadline, so the
            # budget never ends a signal before it; after it, only when the
            # final look failed and spent the last check.
            assert looked_at >= deadline
            return
        assert s.expiry is None
        c = Counters(
            checks_count=c.checks_count + int(s.counts),
            max_checks=c.max_checks,
            consecutive_errors=s.consecutive_errors,
            expires_at=deadline,
        )
        due, reason = s.next_check_at, s.next_reason
    # Every final look failed: still looking; the sweep's grace ends it.
    assert looked_at >= deadline


def test_a_pushing_provider_is_looked_at_next_only_at_the_deadline() -> None:
    deadline = NOW + timedelta(minutes=10)
    s = after_check(
        counters(expires_at=deadline),
        CheckOutcome.NO_MATCH,
        reason=CheckReason.FIRST,
        now=NOW,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
        pushes=True,
    )
    assert s.expiry is None and s.next_check_at == deadline


def test_a_pushing_provider_that_failed_is_retried_on_the_backoff() -> None:
    deadline = NOW + timedelta(minutes=10)
    s = after_check(
        counters(expires_at=deadline),
        CheckOutcome.PROVIDER_ERROR,
        now=NOW,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
        pushes=True,
    )
    assert s.next_check_at < deadline and s.next_reason is CheckReason.ERROR_RETRY


def test_a_ride_along_look_never_spends_the_check_kept_for_the_deadline() -> None:
    """The budget's last check is the deadline's. Another signal's check may
    take this one along up to the coalesce window early: that look must not
    spend it, or the signal would expire by check budget before its deadline."""
    deadline = NOW + timedelta(seconds=1.5)
    early = counters(checks_count=29, expires_at=deadline)
    s = step(early, CheckOutcome.NO_MATCH)
    assert not s.counts and s.expiry is None
    assert s.next_check_at >= deadline
    # Its own look at the deadline spends it and ends the signal.
    own = after_check(
        early,
        CheckOutcome.NO_MATCH,
        looked_at=deadline,
        now=deadline,
        retry_after=None,
        policy=POLICY,
        max_provider_errors=5,
        rand=0.5,
    )
    assert own.counts and own.expiry is ExpiryReason.DEADLINE
