"""Matching rules (docs/api.md, "Matching"): which message satisfies a signal,
and the near misses."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import cycle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain import matching
from app.domain.mail import ParsedMail
from app.domain.matching import (
    Candidate,
    Criteria,
    NearMissPick,
    Pick,
    Verdict,
    Why,
    evaluate,
    pick,
)

WINDOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
RECIPIENT = "qa+run1@example.com"


def make_mail(
    *,
    to: tuple[str, ...] = (RECIPIENT,),
    cc: tuple[str, ...] = (),
    subject: str = "Verify your account",
    text: str = "Your code is 123456",
    html: str = "",
    run_marker: str | None = None,
) -> ParsedMail:
    return ParsedMail(
        subject=subject,
        to=to,
        cc=cc,
        from_addr="noreply@shop.example",
        message_id_header="<m@shop.example>",
        run_marker=run_marker,
        text=text,
        html=html,
        defects=(),
    )


def make_candidate(
    message_id: str = "msg_1",
    *,
    at: datetime = WINDOW + timedelta(seconds=5),
    envelope: tuple[str, ...] = (),
    taken: bool = False,
    **mail_fields: object,
) -> Candidate:
    return Candidate(
        message_id=message_id,
        received_at=at,
        mail=make_mail(**mail_fields),  # type: ignore[arg-type]
        envelope_recipients=envelope,
        taken_by_other=taken,
    )


def make_criteria(**fields: object) -> Criteria:
    base: dict[str, object] = {
        "recipient": RECIPIENT,
        "run_id": "run1",
        "received_after": WINDOW,
    }
    base.update(fields)
    return Criteria(**base)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- recipient


def test_message_to_the_recipient_with_no_filters_matches() -> None:
    verdict = evaluate(make_criteria(), make_candidate())
    assert verdict == Verdict(addressed=True, failures=())
    assert verdict.matched and not verdict.near_miss


@pytest.mark.parametrize(
    "where",
    [
        {"to": ("QA+Run1@Example.COM",)},
        {"to": ("someone@else.example",), "cc": (RECIPIENT,)},
        {"to": (), "envelope": ("Qa+Run1@example.com",)},
    ],
)
def test_recipient_matches_case_insensitively_on_to_cc_or_envelope(
    where: dict[str, object],
) -> None:
    assert evaluate(make_criteria(), make_candidate(**where)).addressed  # type: ignore[arg-type]


def test_plus_tag_is_part_of_the_address() -> None:
    plain = make_candidate(to=("qa@example.com",))
    other_tag = make_candidate(to=("qa+run2@example.com",))
    assert not evaluate(make_criteria(), plain).addressed
    assert not evaluate(make_criteria(), other_tag).addressed


def test_address_containing_the_recipient_is_not_the_recipient() -> None:
    candidate = make_candidate(to=("xqa+run1@example.com", "qa+run1@example.com.evil"))
    assert not evaluate(make_criteria(), candidate).addressed


def test_message_not_addressed_to_recipient_never_matches_nor_near_misses() -> None:
    verdict = evaluate(make_criteria(), make_candidate(to=("other@example.com",), taken=True))
    assert not verdict.addressed
    assert not verdict.matched and not verdict.near_miss
    assert verdict.failures == (Why.TAKEN_BY_OTHER_SIGNAL,)


# --------------------------------------------------------------------------- window


def test_message_received_before_window_never_matches() -> None:
    verdict = evaluate(make_criteria(), make_candidate(at=WINDOW - timedelta(microseconds=1)))
    assert verdict.failures == (Why.RECEIVED_BEFORE_WINDOW,)
    assert verdict.near_miss


def test_message_received_exactly_at_window_start_matches() -> None:
    assert evaluate(make_criteria(), make_candidate(at=WINDOW)).matched


def test_whole_second_stamp_in_the_window_opening_second_is_inside_the_window() -> None:
    """IMAP INTERNALDATE / a Date: header stamp 12:00:00 for a mail delivered
    at 12:00:00.4, 0.4 s after a signal created at 12:00:00.0 + 0.3 s."""
    opened = WINDOW + timedelta(milliseconds=300)
    stamped = WINDOW  # the delivery second, truncated by the provider
    whole = make_criteria(received_after=opened, precision=timedelta(seconds=1))
    assert evaluate(whole, make_candidate(at=stamped)).matched
    exact = make_criteria(received_after=opened)
    assert evaluate(exact, make_candidate(at=stamped)).failures == (Why.RECEIVED_BEFORE_WINDOW,)


def test_whole_second_stamp_of_the_second_before_is_before_the_window() -> None:
    opened = WINDOW + timedelta(milliseconds=300)
    whole = make_criteria(received_after=opened, precision=timedelta(seconds=1))
    verdict = evaluate(whole, make_candidate(at=WINDOW - timedelta(seconds=1)))
    assert verdict.failures == (Why.RECEIVED_BEFORE_WINDOW,)


@given(
    offset_us=st.integers(0, 999_999),
    delivered_after_us=st.integers(0, 5_000_000),
)
def test_a_mail_delivered_after_the_window_opened_always_matches_at_one_second_precision(
    offset_us: int, delivered_after_us: int
) -> None:
    opened = WINDOW + timedelta(microseconds=offset_us)
    delivered = opened + timedelta(microseconds=delivered_after_us)
    stamped = delivered.replace(microsecond=0)  # what a whole-second provider reports
    criteria = make_criteria(received_after=opened, precision=timedelta(seconds=1))
    assert evaluate(criteria, make_candidate(at=stamped)).matched


def test_naive_datetimes_are_read_as_utc() -> None:
    naive_after = WINDOW.replace(tzinfo=None)
    assert evaluate(make_criteria(received_after=naive_after), make_candidate(at=WINDOW)).matched
    early = make_candidate(at=(WINDOW - timedelta(seconds=1)).replace(tzinfo=None))
    assert not evaluate(make_criteria(), early).matched


# --------------------------------------------------------------------------- run marker


def test_message_with_another_runs_marker_does_not_match() -> None:
    verdict = evaluate(make_criteria(), make_candidate(run_marker="run2"))
    assert verdict.failures == (Why.RUN_MARKER_MISMATCH,)


def test_message_with_this_runs_marker_matches() -> None:
    assert evaluate(make_criteria(), make_candidate(run_marker="run1")).matched


def test_run_marker_comparison_is_case_sensitive() -> None:
    verdict = evaluate(make_criteria(), make_candidate(run_marker="RUN1"))
    assert verdict.failures == (Why.RUN_MARKER_MISMATCH,)


def test_message_without_marker_matches_unless_marker_is_required() -> None:
    assert evaluate(make_criteria(), make_candidate()).matched
    verdict = evaluate(make_criteria(require_run_marker=True), make_candidate())
    assert verdict.failures == (Why.RUN_MARKER_MISSING,)


def test_required_marker_present_and_equal_matches() -> None:
    criteria = make_criteria(require_run_marker=True)
    assert evaluate(criteria, make_candidate(run_marker="run1")).matched


# --------------------------------------------------------------------------- subject


def test_subject_filter_is_case_insensitive_substring() -> None:
    criteria = make_criteria(subject_contains="VERIFY YOUR")
    assert evaluate(criteria, make_candidate(subject="Please verify your account")).matched


def test_subject_filter_compares_nfc_forms() -> None:
    # The needle is decomposed (e + combining acute); the subject is precomposed.
    criteria = make_criteria(subject_contains="CAFE\u0301")
    assert evaluate(criteria, make_candidate(subject="Bienvenue au café")).matched


def test_subject_filter_uses_full_case_folding() -> None:
    criteria = make_criteria(subject_contains="STRASSE")
    assert evaluate(criteria, make_candidate(subject="Neue Straße")).matched


def test_wrong_subject_is_a_subject_mismatch() -> None:
    verdict = evaluate(make_criteria(subject_contains="Reset"), make_candidate())
    assert verdict.failures == (Why.SUBJECT_MISMATCH,)


def test_a_long_subject_is_matched_but_not_remembered() -> None:
    """Short subjects and needles are folded once and remembered (a shared
    address's look compares every waiting signal with the same subjects); a
    long one is folded every time, so the memo never holds a huge subject."""
    matching._fold_short.cache_clear()
    criteria = make_criteria(subject_contains="CODE-42")
    long_subject = "Ünïcode " * 500 + "code-42"
    assert evaluate(criteria, make_candidate(subject=long_subject)).matched
    assert evaluate(criteria, make_candidate(subject="Your code-42")).matched
    assert evaluate(criteria, make_candidate(subject="Your code-42")).matched
    memo = matching._fold_short.cache_info()
    assert memo.currsize == 2  # the needle and the short subject, not the long one
    assert memo.hits == 3  # the needle's second and third folds, the short subject's second


def test_a_candidate_is_addressed_whichever_list_names_the_recipient() -> None:
    """The normalised addresses are made once per candidate, from the
    envelope, To and Cc together."""
    criteria = make_criteria()
    for fields in (
        {"envelope": (" <QA+Run1@Example.com> ",), "to": ("x@example.com",)},
        {"to": ("x@example.com",), "cc": ("QA+RUN1@example.com",)},
        {"to": ("QA+run1@EXAMPLE.com",)},
    ):
        candidate = make_candidate(**fields)  # type: ignore[arg-type]
        assert evaluate(criteria, candidate).matched
        assert evaluate(criteria, candidate).matched  # and again, from the made set
    assert not evaluate(criteria, make_candidate(to=("qa+run2@example.com",))).addressed


# --------------------------------------------------------------------------- body


def test_body_filter_is_case_sensitive_substring_of_text() -> None:
    assert evaluate(make_criteria(body_contains="code is 1234"), make_candidate()).matched
    verdict = evaluate(make_criteria(body_contains="CODE IS"), make_candidate())
    assert verdict.failures == (Why.BODY_MISMATCH,)


def test_body_filter_searches_stripped_html_when_there_is_no_text() -> None:
    candidate = make_candidate(text="", html="<p>Click <b>here</b> &amp; verify</p>")
    assert evaluate(make_criteria(body_contains="Click here & verify"), candidate).matched


def test_body_filter_ignores_line_wrapping_and_crlf() -> None:
    candidate = make_candidate(text="Please confirm\r\nyour   email address")
    assert evaluate(make_criteria(body_contains="confirm your email"), candidate).matched


def test_body_filter_compares_nfc_forms() -> None:
    candidate = make_candidate(text="Willkommen im Cafe\u0301")
    assert evaluate(make_criteria(body_contains="Café"), candidate).matched


# --------------------------------------------------------------------------- taken, order


def test_message_of_another_signal_is_taken() -> None:
    verdict = evaluate(make_criteria(), make_candidate(taken=True))
    assert verdict.failures == (Why.TAKEN_BY_OTHER_SIGNAL,)


def test_every_failure_is_reported_in_why_order() -> None:
    criteria = make_criteria(subject_contains="nope", body_contains="nope")
    candidate = make_candidate(at=WINDOW - timedelta(seconds=1), run_marker="run9", taken=True)
    verdict = evaluate(criteria, candidate)
    assert verdict.failures == (
        Why.RUN_MARKER_MISMATCH,
        Why.RECEIVED_BEFORE_WINDOW,
        Why.SUBJECT_MISMATCH,
        Why.BODY_MISMATCH,
        Why.TAKEN_BY_OTHER_SIGNAL,
    )
    # Several failed rules still make a near miss: the first is its why.
    assert verdict.near_miss


def test_why_values_are_the_contract_strings() -> None:
    assert [w.value for w in Why] == [
        "run_marker_mismatch",
        "run_marker_missing",
        "received_before_window",
        "subject_mismatch",
        "body_mismatch",
        "taken_by_other_signal",
        "recipient_typo",
    ]


# --------------------------------------------------------------------------- pick


def test_earliest_matching_message_wins() -> None:
    late = make_candidate("msg_a", at=WINDOW + timedelta(seconds=9))
    early = make_candidate("msg_b", at=WINDOW + timedelta(seconds=2))
    assert pick(make_criteria(), [late, early]).winner == early


def test_equal_instants_are_broken_by_message_id() -> None:
    at = WINDOW + timedelta(seconds=1)
    first, second = make_candidate("msg_a", at=at), make_candidate("msg_b", at=at)
    assert pick(make_criteria(), [second, first]).winner == first


def test_pick_reports_near_misses_with_every_failed_rule_but_not_strangers() -> None:
    before = make_candidate("msg_old", at=WINDOW - timedelta(seconds=3))
    other_run = make_candidate("msg_other", run_marker="run2")
    stranger = make_candidate("msg_stranger", to=("x@example.com",), run_marker="run2")
    double = make_candidate("msg_double", at=WINDOW - timedelta(seconds=1), taken=True)
    result = pick(make_criteria(), [other_run, stranger, double, before])
    assert result == Pick(
        winner=None,
        near_misses=(
            NearMissPick(before, Why.RECEIVED_BEFORE_WINDOW, ()),
            NearMissPick(double, Why.RECEIVED_BEFORE_WINDOW, (Why.TAKEN_BY_OTHER_SIGNAL,)),
            NearMissPick(other_run, Why.RUN_MARKER_MISMATCH, ()),
        ),
    )


def test_another_runs_marker_and_another_subject_is_a_near_miss_on_the_marker() -> None:
    criteria = make_criteria(subject_contains="Verify")
    candidate = make_candidate(run_marker="run2", subject="Welcome aboard")
    (near,) = pick(criteria, [candidate]).near_misses
    assert near.why is Why.RUN_MARKER_MISMATCH
    assert near.also == (Why.SUBJECT_MISMATCH,)


def test_pick_of_nothing_has_no_winner() -> None:
    assert pick(make_criteria(), []) == Pick(winner=None, near_misses=())


# --------------------------------------------------------------------------- properties

offsets = st.integers(min_value=-3600, max_value=3600)
markers = st.sampled_from([None, "run1", "run2"])


@st.composite
def candidates(draw: st.DrawFn) -> Candidate:
    return make_candidate(
        f"msg_{draw(st.integers(0, 50)):02d}",
        at=WINDOW + timedelta(seconds=draw(offsets)),
        to=(draw(st.sampled_from([RECIPIENT, "other@example.com"])),),
        run_marker=draw(markers),
        subject=draw(st.sampled_from(["Verify your account", "Welcome"])),
        taken=draw(st.booleans()),
    )


# Message ids are unique (they are primary keys), so a pool never repeats one.
pools = st.lists(candidates(), max_size=12, unique_by=lambda c: c.message_id)

criteria_strategy = st.builds(
    make_criteria,
    subject_contains=st.sampled_from([None, "verify", "welcome"]),
    require_run_marker=st.booleans(),
)


def swap_case(text: str, flips: list[bool]) -> str:
    return "".join(c.upper() if f else c.lower() for c, f in zip(text, cycle(flips)))


@given(
    st.emails(),
    st.integers(min_value=0, max_value=3600),
    st.sampled_from([None, "run1"]),
    st.lists(st.booleans(), min_size=1, max_size=64),
)
def test_matching_message_keeps_matching_under_recipient_case_changes(
    address: str, offset: int, marker: str | None, flips: list[bool]
) -> None:
    criteria = make_criteria(recipient=address, subject_contains="verify")
    candidate = make_candidate(
        to=(address,), at=WINDOW + timedelta(seconds=offset), run_marker=marker
    )
    assert evaluate(criteria, candidate).matched
    shouted = replace(criteria, recipient=swap_case(address, flips))
    assert evaluate(shouted, candidate).matched
    mail = replace(candidate.mail, to=(swap_case(address, flips[::-1]),))
    assert evaluate(criteria, replace(candidate, mail=mail)).matched


@given(criteria_strategy, pools)
def test_winner_is_always_the_earliest_matched(criteria: Criteria, pool: list[Candidate]) -> None:
    result = pick(criteria, pool)
    matched = [c for c in pool if evaluate(criteria, c).matched]
    if not matched:
        assert result.winner is None
        return
    assert result.winner is not None
    assert evaluate(criteria, result.winner).matched
    assert all(
        (result.winner.received_at, result.winner.message_id) <= (c.received_at, c.message_id)
        for c in matched
    )


@given(criteria_strategy, pools)
def test_candidate_received_before_window_never_wins(
    criteria: Criteria, pool: list[Candidate]
) -> None:
    winner = pick(criteria, pool).winner
    assert winner is None or winner.received_at >= criteria.received_after


@given(criteria_strategy, pools)
def test_near_misses_are_addressed_and_failed_their_why_then_also(
    criteria: Criteria, pool: list[Candidate]
) -> None:
    for candidate, why, also in pick(criteria, pool).near_misses:
        verdict = evaluate(criteria, candidate)
        assert verdict.addressed
        assert verdict.failures == (why, *also)


@given(criteria_strategy, pools, st.randoms())
def test_pick_does_not_depend_on_candidate_order(
    criteria: Criteria, pool: list[Candidate], rnd: object
) -> None:
    shuffled = list(pool)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert pick(criteria, pool) == pick(criteria, shuffled)


# -- body_contains: one normalisation per message, the searched text capped ------


def _search(body: str) -> tuple[ParsedMail, list[Candidate]]:
    mail = make_mail(text=body)
    return mail, [Candidate(message_id="m1", received_at=WINDOW, mail=mail)]


def _criteria(needle: str, cap: int = 1 << 20) -> Criteria:
    return Criteria(
        recipient=RECIPIENT,
        run_id="r",
        received_after=WINDOW - timedelta(seconds=1),
        body_contains=needle,
        text_max_bytes=cap,
    )


def test_body_contains_normalises_a_message_once_for_every_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.domain.mail.parsed as parsed

    calls: list[int] = []
    real = parsed.normalize_whitespace

    def counting(text: str) -> str:
        calls.append(len(text))
        return real(text)

    monkeypatch.setattr(parsed, "normalize_whitespace", counting)
    _, cands = _search("needle-042 " + "filler text\r\n" * 20_000)
    results = [pick(_criteria(f"needle-{i:03d}"), cands).winner for i in range(200)]
    assert [r is not None for r in results].count(True) == 1
    assert len(calls) == 1


def test_body_contains_searches_only_the_first_max_bytes_of_the_text() -> None:
    _, cands = _search("x" * 5000 + " late-needle")
    assert pick(_criteria("late-needle"), cands).winner is not None
    assert pick(_criteria("late-needle", cap=4096), cands).winner is None
    assert pick(_criteria("xxxx", cap=4096), cands).winner is not None


def test_the_cap_never_splits_a_character() -> None:
    mail = make_mail(text="é" * 3000)
    text = mail.searchable_text(1025)
    assert len(text.encode()) <= 1025 and set(text) == {"é"}
