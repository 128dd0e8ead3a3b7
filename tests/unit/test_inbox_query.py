"""The inbox's search parser (app/domain/inbox_query.py): Mailpit's syntax
into a query object; anything it cannot read is a QueryError naming the term."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.inbox_query import (
    InboxQuery,
    Kind,
    QueryError,
    Term,
    normalise_message_id,
    parse_query,
    render,
)


def test_keywords_flags_words_phrases_and_negation_parse_into_terms() -> None:
    q = parse_query(
        'to:A@X.test subject:"Your code" -from:bad@x.test has:attachment is:unread'
        ' hello "two words" !spam message-id:<id-1@x> after:2026-12-01 before:1767225600'
    )
    assert q.terms == (
        Term(Kind.TO, "a@x.test"),
        Term(Kind.SUBJECT, "Your code"),
        Term(Kind.FROM, "bad@x.test", negated=True),
        Term(Kind.HAS_ATTACHMENT),
        Term(Kind.UNREAD),
        Term(Kind.WORD, "hello"),
        Term(Kind.PHRASE, "two words"),
        Term(Kind.WORD, "spam", negated=True),
        Term(Kind.MESSAGE_ID, "id-1@x"),
        Term(Kind.AFTER, datetime(2026, 12, 1, tzinfo=UTC)),
        Term(Kind.BEFORE, datetime(2026, 1, 1, tzinfo=UTC)),
    )


def test_an_empty_search_is_an_empty_query() -> None:
    assert parse_query("   ") == InboxQuery()
    assert not parse_query("")


@pytest.mark.parametrize(
    ("text", "term"),
    [
        ('subject:"open', 'subject:"open'),
        ("to:", "to:"),
        ("-", "-"),
        ("after:someday", "after:someday"),
        ("is:starred", "is:starred"),
        ("has:pdf", "has:pdf"),
        ("tag:x", "tag:x"),
        ("bcc:a@x", "bcc:a@x"),
        ("ok ---", "---"),
        ('to:a"b', 'to:a"b'),
    ],
)
def test_bad_syntax_names_the_term(text: str, term: str) -> None:
    with pytest.raises(QueryError) as raised:
        parse_query(text)
    assert raised.value.term == term


def test_a_word_with_a_colon_that_is_no_keyword_is_a_word() -> None:
    assert parse_query("https://x.test/a").terms == (Term(Kind.WORD, "https://x.test/a"),)


def test_message_ids_are_stored_and_searched_without_angle_brackets() -> None:
    assert normalise_message_id(" <a@b> ") == "a@b"
    assert normalise_message_id("<>") is None


_word = st.text(
    alphabet=st.characters(categories=("L", "N"), include_characters="._@+-"), min_size=1
).filter(lambda w: w[0] not in "-!" and w[0].isalnum() and ":" not in w)
_phrase = st.lists(_word, min_size=1, max_size=3).map(" ".join)
_moment = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_term = st.one_of(
    st.builds(
        Term, st.sampled_from([Kind.TO, Kind.FROM, Kind.CC]), _phrase.map(str.lower), st.booleans()
    ),
    st.builds(Term, st.just(Kind.SUBJECT), _phrase, st.booleans()),
    st.builds(Term, st.sampled_from([Kind.AFTER, Kind.BEFORE]), _moment, st.booleans()),
    st.builds(
        Term,
        st.sampled_from([Kind.HAS_ATTACHMENT, Kind.READ, Kind.UNREAD]),
        st.none(),
        st.booleans(),
    ),
    st.builds(Term, st.just(Kind.WORD), _word, st.booleans()),
    st.builds(Term, st.just(Kind.PHRASE), _phrase, st.booleans()),
)


@given(st.lists(_term, max_size=8).map(lambda ts: InboxQuery(tuple(ts))))
def test_a_rendered_query_parses_back_to_itself(query: InboxQuery) -> None:
    assert parse_query(render(query)) == query


@given(st.text(max_size=200))
def test_any_text_parses_or_names_a_term_it_holds(text: str) -> None:
    try:
        query = parse_query(text)
    except QueryError as exc:
        assert exc.term.rstrip("…") in text or exc.term[:40] in text
    else:
        assert all(isinstance(t, Term) for t in query.terms)
