"""recommend: one actionable sentence naming why a signal ended in the dead-letter queue."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.diagnosis import Diagnosis, NearMiss, recommend
from app.domain.matching import Why

WINDOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def diagnosis(
    reason: str = "deadline",
    *,
    provider: str = "sink",
    checks: Mapping[str, int] | None = None,
    last_error_code: str | None = None,
    near_misses: Sequence[NearMiss] = (),
    subject_contains: str | None = None,
) -> Diagnosis:
    return Diagnosis(
        reason=reason,
        provider=provider,
        received_after=WINDOW,
        checks_by_outcome={"no_match": 12} if checks is None else checks,
        last_error_code=last_error_code,
        near_misses=near_misses,
        subject_contains=subject_contains,
    )


def near(
    why: Why,
    *,
    before: float = -5.0,
    subject: str = "Verify your account",
    run_marker: str | None = None,
    message_id: str = "msg_1",
) -> NearMiss:
    return NearMiss(
        message_id=message_id,
        received_at=WINDOW + timedelta(seconds=before),
        subject=subject,
        why=why.value,
        run_marker=run_marker,
    )


def assert_one_sentence(sentence: str) -> None:
    assert sentence.endswith(".")
    assert "\n" not in sentence
    assert not re.search(r"[.!?] [A-Z]", sentence), sentence


def test_message_before_window_names_the_gap_in_seconds() -> None:
    sentence = recommend(diagnosis(near_misses=[near(Why.RECEIVED_BEFORE_WINDOW, before=-3)]))
    assert sentence == (
        "A message to this recipient arrived 3 s before the window opened: send the email "
        "after creating the signal, or set received_after earlier."
    )


def test_gap_uses_the_latest_message_before_the_window() -> None:
    misses = [
        near(Why.RECEIVED_BEFORE_WINDOW, before=-600, message_id="msg_old"),
        near(Why.RECEIVED_BEFORE_WINDOW, before=-7.4, message_id="msg_new"),
    ]
    assert "arrived 7 s before the window" in recommend(diagnosis(near_misses=misses))


@pytest.mark.parametrize(
    ("before", "shown"),
    [(-0.3, "less than 1 s"), (-90, "90 s"), (-600, "10 min"), (-3 * 3600, "3 h")],
)
def test_gap_is_shown_in_a_readable_unit(before: float, shown: str) -> None:
    sentence = recommend(diagnosis(near_misses=[near(Why.RECEIVED_BEFORE_WINDOW, before=before)]))
    assert f"arrived {shown} before the window opened" in sentence


def test_run_marker_mismatch_names_the_other_runs_marker() -> None:
    miss = near(Why.RUN_MARKER_MISMATCH, before=4, run_marker="ci-build-41")
    sentence = recommend(diagnosis(near_misses=[miss]))
    assert "carried run marker 'ci-build-41'" in sentence
    assert "run_id" in sentence
    assert_one_sentence(sentence)


def test_run_marker_mismatch_without_known_marker_still_names_the_cause() -> None:
    sentence = recommend(diagnosis(near_misses=[near(Why.RUN_MARKER_MISMATCH, before=4)]))
    assert "carried another run's marker" in sentence


def test_run_marker_missing_names_the_required_header() -> None:
    sentence = recommend(diagnosis(near_misses=[near(Why.RUN_MARKER_MISSING, before=4)]))
    assert "without a run marker" in sentence
    assert "require_run_marker" in sentence


def test_subject_mismatch_shows_the_subject_that_arrived_and_the_filter() -> None:
    miss = near(Why.SUBJECT_MISMATCH, before=2, subject="Welcome aboard")
    sentence = recommend(diagnosis(near_misses=[miss], subject_contains="Verify"))
    assert "subject 'Welcome aboard'" in sentence
    assert "does not contain 'Verify'" in sentence
    assert_one_sentence(sentence)


def test_quoted_subject_never_leaks_a_code_link_or_address() -> None:
    subject = "Your code 482913 for qa+run1@example.com: https://x.example/v?t=abc"
    miss = near(Why.SUBJECT_MISMATCH, before=2, subject=subject)
    sentence = recommend(diagnosis(near_misses=[miss], subject_contains="Reset"))
    assert "482913" not in sentence
    assert "qa+run1@example.com" not in sentence
    assert "https://" not in sentence and "x.example" not in sentence
    assert "<code>" in sentence and "<address>" in sentence and "<link>" in sentence


def test_body_mismatch_names_body_contains() -> None:
    sentence = recommend(diagnosis(near_misses=[near(Why.BODY_MISMATCH, before=2)]))
    assert "body_contains" in sentence


def test_taken_by_other_signal_names_the_competing_signal() -> None:
    sentence = recommend(diagnosis(near_misses=[near(Why.TAKEN_BY_OTHER_SIGNAL, before=2)]))
    assert "already the message of another signal" in sentence


def test_most_telling_near_miss_is_chosen_in_why_order() -> None:
    misses = [
        near(Why.SUBJECT_MISMATCH, before=2, subject="Welcome"),
        near(Why.RECEIVED_BEFORE_WINDOW, before=-3),
    ]
    assert "3 s before the window" in recommend(diagnosis(near_misses=misses))


def test_unknown_why_values_are_ignored() -> None:
    miss = NearMiss("msg_1", WINDOW, "s", "something_new")
    assert recommend(diagnosis(near_misses=[miss])).startswith("No message to this recipient")


def test_provider_errors_name_the_last_error_code_and_the_provider() -> None:
    sentence = recommend(
        diagnosis(
            "provider_errors",
            provider="corp-imap",
            checks={"provider_error": 5, "no_match": 1},
            last_error_code="imap_auth_failed",
        )
    )
    assert "'corp-imap'" in sentence
    assert "imap_auth_failed" in sentence
    assert "check the provider" in sentence
    assert_one_sentence(sentence)


def test_mostly_failed_checks_blame_the_provider_even_at_the_deadline() -> None:
    sentence = recommend(
        diagnosis(checks={"provider_error": 8, "no_match": 2}, last_error_code="timeout")
    )
    assert sentence.startswith("Provider 'sink' failed 8 of 10 checks")


def test_open_circuit_dominance_says_the_circuit_was_open() -> None:
    sentence = recommend(
        diagnosis(
            checks={"circuit_open": 20, "provider_error": 3, "no_match": 2},
            last_error_code="connection_refused",
            near_misses=[near(Why.RECEIVED_BEFORE_WINDOW)],
        )
    )
    assert "circuit breaker for provider 'sink' was open for 20 of 25 checks" in sentence
    assert "connection_refused" in sentence


def test_claims_exhausted_says_the_consumer_never_consumed_within_the_lease() -> None:
    sentence = recommend(diagnosis("claims_exhausted", checks={"matched": 1, "no_match": 3}))
    assert "claimed the message but never consumed it within the lease" in sentence


def test_no_message_at_the_deadline_points_at_the_sender() -> None:
    sentence = recommend(diagnosis("deadline", checks={"no_match": 12}))
    assert sentence.startswith("No message to this recipient reached provider 'sink'")
    assert "before the deadline" in sentence
    assert "right address and SMTP host" in sentence
    assert "expires_in_seconds" in sentence


def test_no_message_within_the_check_budget_suggests_more_checks() -> None:
    sentence = recommend(diagnosis("check_budget", checks={"no_match": 30}))
    assert "within the check budget (30 checks)" in sentence
    assert "max_checks" in sentence


def test_no_check_at_all_points_at_the_workers() -> None:
    sentence = recommend(diagnosis("deadline", checks={}))
    assert "No check of provider 'sink' ran" in sentence
    assert "workers" in sentence


def test_provider_name_and_error_code_cannot_inject_text() -> None:
    sentence = recommend(
        diagnosis(
            "provider_errors",
            provider="sink'\nInjected. Sentence",
            checks={"provider_error": 1},
            last_error_code="bad code\nhttps://evil",
        )
    )
    assert "\n" not in sentence
    assert "https://" not in sentence


# --------------------------------------------------------------------------- properties

reasons = st.sampled_from(["deadline", "check_budget", "provider_errors", "claims_exhausted"])
outcome_counts = st.dictionaries(
    st.sampled_from(["no_match", "matched", "provider_error", "circuit_open"]),
    st.integers(min_value=0, max_value=1000),
)
near_miss_lists = st.lists(
    st.builds(
        NearMiss,
        message_id=st.just("msg_1"),
        received_at=st.datetimes(
            min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1), timezones=st.just(UTC)
        ),
        subject=st.text(max_size=200),
        why=st.sampled_from([w.value for w in Why]),
        run_marker=st.one_of(st.none(), st.text(max_size=40)),
    ),
    max_size=5,
)


@given(reasons, outcome_counts, st.one_of(st.none(), st.text()), near_miss_lists)
def test_recommendation_is_always_one_line_ending_in_a_period(
    reason: str,
    checks: dict[str, int],
    error_code: str | None,
    misses: list[NearMiss],
) -> None:
    sentence = recommend(
        diagnosis(reason, checks=checks, last_error_code=error_code, near_misses=misses)
    )
    assert sentence.endswith(".")
    assert "\n" not in sentence and "\r" not in sentence


@given(
    st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZ0123456789", min_size=4, max_size=10).filter(
        lambda s: any(c.isdigit() for c in s)
    ),
    st.text(max_size=40),
)
def test_a_code_in_the_subject_never_reaches_the_recommendation(code: str, prefix: str) -> None:
    miss = near(Why.SUBJECT_MISMATCH, subject=f"{prefix} {code} ")
    sentence = recommend(diagnosis(near_misses=[miss], subject_contains="zzz"))
    assert f" {code} " not in f" {sentence} ".replace("'", " ")
