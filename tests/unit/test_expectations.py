"""What `expect` decides on one look (app/domain/expectations.py): pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from app.domain.expectations import (
    Absent,
    Arrival,
    Arrived,
    Duplicate,
    Expect,
    Settle,
    Take,
    Undecided,
    arrived_sentence,
    decide,
    duplicate_sentence,
    effective_settle,
)
from app.domain.states import TRANSITIONS, Status, transition

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DEADLINE = T0 + timedelta(seconds=60)
SECOND = timedelta(seconds=1)


def arrival(seconds: float, mid: str | None = None) -> Arrival:
    return Arrival(mid or f"msg_{seconds}", T0 + timedelta(seconds=seconds))


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --------------------------------------------------------------------------- none


def test_none_with_a_match_is_arrived_at_once_whatever_the_clock() -> None:
    d = decide(Expect.NONE, [arrival(3)], looked_at=at(3.1), deadline=DEADLINE)
    assert d == Arrived(arrival(3))


def test_none_without_a_match_is_undecided_before_the_deadline_and_absent_from_it() -> None:
    assert decide(Expect.NONE, [], looked_at=DEADLINE - timedelta(microseconds=1),
                  deadline=DEADLINE) == Undecided()  # fmt: skip
    assert decide(Expect.NONE, [], looked_at=DEADLINE, deadline=DEADLINE) == Absent()


def test_none_arrived_names_the_earliest_match() -> None:
    d = decide(Expect.NONE, [arrival(9, "msg_b"), arrival(2, "msg_a")], looked_at=at(10),
               deadline=DEADLINE)  # fmt: skip
    assert d == Arrived(arrival(2, "msg_a"))


@given(
    looked=st.floats(min_value=-100, max_value=200),
    matches=st.lists(st.floats(min_value=-10, max_value=60), max_size=4),
)
def test_none_is_absent_only_from_a_look_at_or_after_the_deadline_that_saw_no_match(
    looked: float, matches: list[float]
) -> None:
    d = decide(Expect.NONE, [arrival(s) for s in matches], looked_at=at(looked), deadline=DEADLINE)
    if isinstance(d, Absent):
        assert at(looked) >= DEADLINE and not matches
    assert isinstance(d, Arrived) == bool(matches)


# --------------------------------------------------------------------------- exactly one


def test_exactly_one_settles_until_the_settle_time_after_the_first_match() -> None:
    d = decide(Expect.EXACTLY_ONE, [arrival(10)], looked_at=at(11), deadline=DEADLINE,
               settle_seconds=5)  # fmt: skip
    assert d == Settle(arrival(10), at(15))


def test_exactly_one_is_taken_by_a_look_at_or_after_the_settle_end() -> None:
    d = decide(Expect.EXACTLY_ONE, [arrival(10)], looked_at=at(15), deadline=DEADLINE,
               settle_seconds=5)  # fmt: skip
    assert d == Take(arrival(10))


def test_the_settle_time_ends_at_the_deadline_if_that_comes_first() -> None:
    d = decide(Expect.EXACTLY_ONE, [arrival(58)], looked_at=at(59), deadline=DEADLINE,
               settle_seconds=30)  # fmt: skip
    assert d == Settle(arrival(58), DEADLINE)
    assert decide(Expect.EXACTLY_ONE, [arrival(58)], looked_at=DEADLINE, deadline=DEADLINE,
                  settle_seconds=30) == Take(arrival(58))  # fmt: skip


def test_whole_second_stamps_end_the_settle_time_a_second_later() -> None:
    d = decide(Expect.EXACTLY_ONE, [arrival(10)], looked_at=at(15.5), deadline=DEADLINE,
               settle_seconds=5, precision=SECOND)  # fmt: skip
    assert d == Settle(arrival(10), at(16))


def test_a_second_match_within_the_settle_time_is_a_duplicate_with_its_gap() -> None:
    d = decide(Expect.EXACTLY_ONE, [arrival(10.3, "msg_2"), arrival(10, "msg_1")],
               looked_at=at(10.4), deadline=DEADLINE, settle_seconds=5)  # fmt: skip
    assert d == Duplicate(arrival(10, "msg_1"), arrival(10.3, "msg_2"))
    assert isinstance(d, Duplicate) and abs(d.seconds_apart - 0.3) < 1e-6


def test_a_second_match_after_the_settle_time_is_no_duplicate() -> None:
    d = decide(Expect.EXACTLY_ONE, [arrival(10), arrival(15.5)], looked_at=at(16),
               deadline=DEADLINE, settle_seconds=5)  # fmt: skip
    assert d == Take(arrival(10))


def test_exactly_one_without_a_match_is_undecided_even_at_the_deadline() -> None:
    assert decide(Expect.EXACTLY_ONE, [], looked_at=DEADLINE, deadline=DEADLINE) == Undecided()


@given(
    looked=st.floats(min_value=0, max_value=120),
    matches=st.lists(st.floats(min_value=0, max_value=60), min_size=1, max_size=4),
    settle=st.integers(min_value=1, max_value=300),
    whole_seconds=st.booleans(),
)
def test_exactly_one_is_taken_only_after_a_full_settle_time_without_a_second(
    looked: float, matches: list[float], settle: int, whole_seconds: bool
) -> None:
    precision = SECOND if whole_seconds else timedelta(0)
    d = decide(
        Expect.EXACTLY_ONE,
        [arrival(s, f"msg_{i}") for i, s in enumerate(matches)],
        looked_at=at(looked),
        deadline=DEADLINE,
        settle_seconds=settle,
        precision=precision,
    )
    first, *rest = sorted(matches)
    if isinstance(d, Take):
        end = min(at(first) + precision + timedelta(seconds=settle), DEADLINE)
        assert at(looked) >= end
        assert all(s - first > settle for s in rest)
    if isinstance(d, Duplicate):
        assert 0 <= d.seconds_apart <= settle
    assert isinstance(d, Take | Settle | Duplicate)


def test_first_takes_the_earliest_match() -> None:
    d = decide(Expect.FIRST, [arrival(5), arrival(2)], looked_at=at(6), deadline=DEADLINE)
    assert d == Take(arrival(2))


def test_the_settle_time_is_kept_for_exactly_one_only() -> None:
    assert effective_settle(Expect.EXACTLY_ONE, None) == 5
    assert effective_settle(Expect.EXACTLY_ONE, 12) == 12
    assert effective_settle(Expect.NONE, None) is None
    assert effective_settle(Expect.FIRST, None) is None


def test_the_sentences_say_what_happened_and_what_to_do() -> None:
    assert "0.3 s apart" in duplicate_sentence(0.3, 5)
    assert "settle_seconds 5" in duplicate_sentence(0.3, 5)
    assert "twice" in duplicate_sentence(0.3, 5)
    assert "12 s after the window opened" in arrived_sentence(12.2)
    assert "none was expected" in arrived_sentence(0)


# --------------------------------------------------------------------------- states


def test_absent_and_arrived_are_reached_from_waiting_only_and_are_final() -> None:
    assert (Status.WAITING, Status.ABSENT) in TRANSITIONS
    assert (Status.WAITING, Status.ARRIVED) in TRANSITIONS
    for src, dst in TRANSITIONS:
        assert src not in (Status.ABSENT, Status.ARRIVED)
        if dst in (Status.ABSENT, Status.ARRIVED):
            assert src is Status.WAITING
    for dst in Status:
        for final in (Status.ABSENT, Status.ARRIVED):
            try:
                transition(final, dst)
            except ValueError:
                continue
            raise AssertionError(f"{final} → {dst} must not be allowed")
