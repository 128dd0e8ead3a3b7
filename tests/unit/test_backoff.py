"""Backoff: exponential, capped, jittered, never past the deadline (docs/api.md,
"Nothing before the deadline is lost")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.backoff import (
    MIN_DELAY_SECONDS,
    BackoffPolicy,
    next_check_at,
    poll_hint_seconds,
    retry_after_seconds,
)

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
MIDDLE = 0.5  # rand that applies no jitter


def test_delay_doubles_from_the_base_until_the_cap() -> None:
    policy = BackoffPolicy(base_seconds=1.0, factor=2.0, cap_seconds=30.0, jitter=0.2)
    assert [policy.delay(n, MIDDLE) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_jitter_moves_the_delay_by_at_most_the_jitter_fraction() -> None:
    policy = BackoffPolicy(base_seconds=10.0, cap_seconds=100.0, jitter=0.2)
    assert policy.delay(1, 0.0) == pytest.approx(8.0)
    assert policy.delay(1, 0.999999) == pytest.approx(12.0, abs=1e-4)


def test_jitter_never_lifts_the_delay_above_the_cap() -> None:
    policy = BackoffPolicy(cap_seconds=30.0, jitter=0.5)
    assert policy.delay(50, 0.999) == 30.0


def test_delay_never_drops_below_the_floor() -> None:
    policy = BackoffPolicy(base_seconds=0.01, jitter=0.9)
    assert policy.delay(1, 0.0) == MIN_DELAY_SECONDS


def test_checks_done_below_one_is_the_first_wait() -> None:
    policy = BackoffPolicy()
    assert policy.delay(0, MIDDLE) == policy.delay(1, MIDDLE) == 1.0


def test_huge_check_counts_do_not_overflow() -> None:
    assert BackoffPolicy(factor=10.0).delay(100_000, MIDDLE) == 30.0


@pytest.mark.parametrize(
    "fields",
    [
        {"base_seconds": 0},
        {"factor": 0.5},
        {"cap_seconds": -1},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"base_seconds": float("nan")},
    ],
)
def test_policy_that_cannot_back_off_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(**fields)


def test_next_check_is_now_plus_delay_inside_the_window() -> None:
    assert next_check_at(NOW, 2.5, NOW + timedelta(minutes=1)) == NOW + timedelta(seconds=2.5)


def test_next_check_is_clamped_to_the_deadline() -> None:
    deadline = NOW + timedelta(seconds=3)
    assert next_check_at(NOW, 30.0, deadline) == deadline
    assert next_check_at(NOW, float("inf"), deadline) == deadline


def test_next_check_after_the_deadline_passed_is_the_deadline() -> None:
    deadline = NOW - timedelta(seconds=10)
    assert next_check_at(NOW, 0.0, deadline) == deadline


def test_negative_delay_means_now() -> None:
    assert next_check_at(NOW, -5.0, NOW + timedelta(minutes=1)) == NOW


def test_retry_after_rounds_the_wait_up() -> None:
    assert retry_after_seconds(NOW, NOW + timedelta(seconds=2)) == 2
    assert retry_after_seconds(NOW, NOW + timedelta(seconds=2, microseconds=1)) == 3


def test_retry_after_is_at_least_one_second() -> None:
    assert retry_after_seconds(NOW, None) == 1
    assert retry_after_seconds(NOW, NOW) == 1
    assert retry_after_seconds(NOW, NOW - timedelta(seconds=30)) == 1
    assert retry_after_seconds(NOW, NOW + timedelta(milliseconds=10)) == 1


# --------------------------------------------------------------------------- properties

policies = st.builds(
    BackoffPolicy,
    base_seconds=st.floats(min_value=0.001, max_value=60),
    factor=st.floats(min_value=1.0, max_value=10),
    cap_seconds=st.floats(min_value=0.01, max_value=3600),
    jitter=st.floats(min_value=0.0, max_value=0.99),
)
checks = st.integers(min_value=1, max_value=10_000)
rands = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(policies, checks, checks)
def test_unjittered_delay_is_monotone_non_decreasing(policy: BackoffPolicy, a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert policy.base_delay(low) <= policy.base_delay(high)


@given(policies, checks, checks, rands)
def test_delay_with_the_same_rand_is_monotone_non_decreasing(
    policy: BackoffPolicy, a: int, b: int, rand: float
) -> None:
    low, high = sorted((a, b))
    assert policy.delay(low, rand) <= policy.delay(high, rand)


@given(policies, checks, rands)
def test_delay_is_never_above_the_cap_nor_below_the_floor(
    policy: BackoffPolicy, n: int, rand: float
) -> None:
    delay = policy.delay(n, rand)
    assert delay <= policy.cap_seconds
    assert delay >= min(MIN_DELAY_SECONDS, policy.cap_seconds)


@given(policies, checks, rands)
def test_delay_stays_within_the_jitter_band_of_the_base_delay(
    policy: BackoffPolicy, n: int, rand: float
) -> None:
    base = policy.base_delay(n)
    delay = policy.delay(n, rand)
    floor = min(MIN_DELAY_SECONDS, policy.cap_seconds)
    assert delay >= min(base * (1 - policy.jitter), policy.cap_seconds) - 1e-9 or delay == floor
    assert delay <= base * (1 + policy.jitter) + 1e-9 or delay == floor


@given(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
    st.integers(min_value=-86_400, max_value=86_400),
)
def test_next_check_is_never_past_the_deadline(delay: float, deadline_offset: int) -> None:
    deadline = NOW + timedelta(seconds=deadline_offset)
    due = next_check_at(NOW, delay, deadline)
    assert due <= deadline
    if deadline >= NOW:
        assert due >= NOW


@given(st.integers(min_value=-(10**9), max_value=10**9))
def test_retry_after_is_a_whole_second_count_covering_the_wait(micros: int) -> None:
    wait = timedelta(microseconds=micros)
    seconds = retry_after_seconds(NOW, NOW + wait)
    assert seconds >= 1
    assert timedelta(seconds=seconds) >= wait
    assert seconds == 1 or timedelta(seconds=seconds - 1) < wait


def test_the_poll_hint_of_a_pushing_provider_is_at_most_five_seconds() -> None:
    # A sink signal's next scheduled check is its deadline: 117 s away is no hint.
    deadline = NOW + timedelta(seconds=117)
    assert poll_hint_seconds(NOW, deadline, pushes=True) == 5
    assert poll_hint_seconds(NOW, NOW + timedelta(seconds=2), pushes=True) == 2
    assert poll_hint_seconds(NOW, None, pushes=True) == 1


def test_the_poll_hint_of_a_polled_provider_is_its_next_check() -> None:
    assert poll_hint_seconds(NOW, NOW + timedelta(seconds=17), pushes=False) == 17


def test_a_forked_child_draws_other_jitter_than_its_parent() -> None:
    """The checks' jitter generator is seeded again in a forked child (a
    worker's pool): the children of one parent do not retry in step."""
    import os

    from app.usecases.checks import runner as run

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next draws, then out at once
        os.write(write, repr([run._JITTER.random() for _ in range(3)]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.close(write)
    assert child != repr([run._JITTER.random() for _ in range(3)])
