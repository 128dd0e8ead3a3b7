"""What a polled provider downloads for a look (`app.providers.narrowing`), and
the IMAP SEARCH it sends: narrow, but never narrower than the matcher."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.header import decode_header, make_header

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.mail import parse_mail
from app.providers.base import WHOLE_SECONDS
from app.providers.imap import search_criteria
from app.providers.narrowing import header_forms, named_in, narrowing, searchable

T = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def test_each_recipient_spans_from_its_own_window_minus_the_lookback_in_whole_seconds() -> None:
    plan = narrowing(
        T - timedelta(minutes=10, microseconds=300),
        ["a@x.test", "B@x.test"],
        {"a@x.test": T + timedelta(microseconds=700), "B@x.test": T + timedelta(minutes=5)},
        WHOLE_SECONDS,
    )

    spans = {s.recipient: (s.start, s.window) for s in plan.spans}
    assert spans == {
        # floored: a message stamped in the window's second is inside it
        "a@x.test": (T - timedelta(minutes=10, seconds=1), T),
        "b@x.test": (T - timedelta(minutes=5, seconds=1), T + timedelta(minutes=5)),
    }
    assert plan.since == T - timedelta(minutes=10, seconds=1)
    assert plan.narrowed


def test_a_recipient_without_a_window_opens_at_since_and_no_recipients_narrow_nothing() -> None:
    plan = narrowing(T, ["a@x.test"], {}, WHOLE_SECONDS)
    assert [(s.start, s.window) for s in plan.spans] == [(T, T)]

    open_plan = narrowing(T + timedelta(microseconds=5), [], {}, WHOLE_SECONDS)
    assert not open_plan.narrowed and open_plan.since == T


def test_a_window_at_the_beginning_of_time_does_not_overflow() -> None:
    start = datetime.min.replace(tzinfo=UTC)
    plan = narrowing(start, ["a@x.test"], {"a@x.test": start}, WHOLE_SECONDS)
    assert plan.spans[0].start == start
    assert search_criteria(plan)[0][0] == '(SINCE 1-Jan-0001 OR TO "a@x.test" CC "a@x.test")'


def test_only_plain_ascii_addresses_are_searched_for_as_text() -> None:
    assert searchable("qa+run-1@example.test")
    for odd in ("josé@example.test", '"a b"@x.test', "a\\b@x.test", "nobody", "a@b@c", "@x", "a@"):
        assert not searchable(odd), odd


def test_a_header_names_a_recipient_in_any_spelling_a_parser_reads() -> None:
    for header in (
        "qa@example.test",
        '"QA Team" <QA@Example.TEST>',
        "Someone <other@example.test>, qa@example.test (the QA box)",
        "team: qa@example.test, other@example.test;",
        "qa @ example.test",
        '"q""a" (x) @ example.test',
        "q(a comment (nested))a@example.test",
        "QA@EXAMPLE.TEST\x00",
    ):
        assert named_in("qa@example.test", header_forms(header)), header
    assert not named_in("qa@example.test", header_forms("other@example.test"))
    assert not named_in("qa@example.test", header_forms("qa@example.org"))


def test_imap_searches_each_recipient_by_to_or_cc_since_the_day_before_its_span() -> None:
    plan = narrowing(
        T - timedelta(minutes=10),
        ["a@x.test", "b@x.test"],
        {"a@x.test": T, "b@x.test": T + timedelta(days=2)},
        WHOLE_SECONDS,
    )
    assert search_criteria(plan) == [
        [
            "OR",
            '(SINCE 30-Nov-2026 OR TO "a@x.test" CC "a@x.test")',
            '(SINCE 2-Dec-2026 OR TO "b@x.test" CC "b@x.test")',
        ]
    ]


def test_imap_groups_many_recipients_into_several_searches() -> None:
    recipients = [f"user{i}@x.test" for i in range(60)]
    commands = search_criteria(
        narrowing(T, recipients, dict.fromkeys(recipients, T), WHOLE_SECONDS)
    )
    assert [len(c) for c in commands] == [49, 49, 19]  # 25, 25 and 10 keys, OR-ed
    keys = [k for c in commands for k in c if k != "OR"]
    assert sorted(keys) == sorted(f'(SINCE 30-Nov-2026 OR TO "{r}" CC "{r}")' for r in recipients)
    assert max(len(" ".join(c)) for c in commands) < 8000


def test_imap_falls_back_to_a_plain_since_search_for_an_unquotable_recipient() -> None:
    plan = narrowing(T, ["a@x.test", "josé@x.test"], {}, WHOLE_SECONDS)
    assert search_criteria(plan) == [["SINCE", "30-Nov-2026"]]
    assert search_criteria(narrowing(T, [], {}, WHOLE_SECONDS)) == [["SINCE", "30-Nov-2026"]]


# Header text made of the characters address syntax gives a meaning to.
_HEADER = st.lists(
    st.sampled_from([*'abcAB.-+_@<>"(),;: \\', "x.test", "qa", "@x.test", "=?utf-8?q?a?="]),
    max_size=30,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(to=_HEADER, cc=_HEADER)
def test_every_searchable_address_the_parser_reads_from_to_or_cc_is_named_in_its_header(
    to: str, cc: str
) -> None:
    """The lossless side: whatever address the matcher's parser reads from a
    header, the header's text (decoded, as MailDev serves it and IMAP searches
    it) names it, so its message is downloaded."""
    raw = f"From: a@b.test\r\nTo: {to}\r\nCc: {cc}\r\nSubject: s\r\n\r\nbody\r\n".encode()
    mail = parse_mail(raw)
    text = "\n".join((to, cc, _decoded(to), _decoded(cc)))
    for address in (*mail.to, *mail.cc):
        if searchable(address):
            assert named_in(address, header_forms(text)), (address, to, cc)


def _decoded(value: str) -> str:
    try:
        return str(make_header(decode_header(value)))
    except Exception:  # an encoded word the stdlib cannot decode: the raw text stands
        return value
