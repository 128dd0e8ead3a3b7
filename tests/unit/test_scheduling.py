"""What follows a check: budget, provider errors, deadline, Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.backoff import BackoffPolicy
from app.domain.scheduling import Counters, after_check
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


def test_last_check_of_the_budget_expires_with_check_budget() -> None:
    s = step(counters(checks_count=29), CheckOutcome.NO_MATCH)
    assert s.expiry is ExpiryReason.CHECK_BUDGET


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
