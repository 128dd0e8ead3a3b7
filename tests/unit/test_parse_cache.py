"""What a look keeps of parsed mail (issue 45): the parse cache is bounded by
bytes, a cached parse keeps only what matching reads, and a look's raw reads
come in batches of at most SIGNALBOX_LOOK_MAX_BYTES."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.mail import parse_mail
from app.providers.base import ProviderMessage
from app.usecases.checks import observed

MIB = 1024 * 1024
NOW = datetime(2026, 12, 6, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    observed.forget_parsed()
    yield
    observed.forget_parsed()


def mail_with(text: str = "", html: str = "") -> bytes:
    if html:
        head = b"Content-Type: text/html; charset=utf-8\r\n"
        body = html
    else:
        head = b"Content-Type: text/plain; charset=utf-8\r\n"
        body = text
    return (
        b"From: a@example.test\r\nTo: b@example.test\r\nSubject: hi\r\n" + head + b"\r\n"
        + body.encode()
    )  # fmt: skip


def test_a_slim_parse_searches_exactly_what_the_whole_one_did() -> None:
    cap = 4096
    for raw in (
        mail_with(text=("word " * 5000) + "TAIL-CODE 123\n"),
        mail_with(html="<p>" + ("x&amp;y " * 4000) + "</p><b>493817</b>"),
        mail_with(text="  \n" * 10 + "short body\n"),
    ):
        whole = parse_mail(raw)
        kept = observed.slim(whole, cap)
        assert kept.searchable_text(cap) == whole.searchable_text(cap)
        assert len(kept.text) <= cap and len(kept.html) <= 4 * cap
        assert (kept.subject, kept.to, kept.run_marker) == (
            whole.subject,
            whole.to,
            whole.run_marker,
        )


def test_a_23_mib_text_part_is_kept_as_its_first_mebibyte() -> None:
    whole = parse_mail(mail_with(text=("0123456789abcdef " * 64 + "\n") * 22_000))
    assert len(whole.text) > 22 * MIB
    kept = observed.slim(whole, MIB)
    assert observed._size_of(kept) < 3 * MIB


def facts(size: int) -> observed._Facts:
    mail = parse_mail(mail_with(text="x"))
    return observed._Facts(mail, False, size, {})


def test_the_cache_is_bounded_by_bytes_not_entries() -> None:
    limit = observed.PARSED_CACHE_MAX_BYTES
    one = limit // 10
    for i in range(50):
        observed._remember("sink", str(i), facts(one))
    assert observed._parsed_bytes <= limit
    assert len(observed._PARSED) == 10
    # The latest stay, the oldest went.
    assert observed._cached("sink", "49") is not None
    assert observed._cached("sink", "0") is None
    # One parse larger than a quarter of the bound is never kept.
    observed._remember("sink", "huge", facts(limit // 2))
    assert observed._cached("sink", "huge") is None


def message(i: int, size: int) -> ProviderMessage:
    return ProviderMessage(str(i), NOW, None, size=size)


@given(
    sizes=st.lists(st.integers(1, 30 * MIB), min_size=1, max_size=60),
    cached=st.sets(st.integers(0, 59)),
)
def test_a_look_reads_at_most_its_byte_bound_of_raw_at_a_time(
    sizes: list[int], cached: set[int]
) -> None:
    observed.forget_parsed()
    for i in cached:
        observed._remember("sink", str(i), facts(1024))
    bound = 64 * MIB
    messages = [message(i, s) for i, s in enumerate(sizes)]
    batches = list(observed._batches("sink", messages, bound))
    assert [m for b in batches for m in b] == messages  # all of them, in order
    for batch in batches:
        to_read = [m.raw_size for m in batch if int(m.provider_message_id) not in cached]
        # Within the bound, or a single message larger than it, alone.
        assert sum(to_read) <= bound or len(to_read) == 1


def test_the_recorded_messages_a_process_remembers_are_bounded_and_forgotten() -> None:
    """The sink's inbox record leaves out what a look here recorded; what is
    remembered of that stays within RECORDED_MEMORY (the oldest let go: its
    record only finds it recorded), and a move to another database forgets it."""
    count = observed.RECORDED_MEMORY + 10
    observed.note_recorded(("sink", str(i)) for i in range(count))
    assert not any(observed.recorded_here("sink", str(i)) for i in range(10))
    assert all(observed.recorded_here("sink", str(i)) for i in range(10, count))
    assert not observed.recorded_here("other", str(count - 1))  # per provider
    # Noted again, an old one is the newest: the next evicted is another.
    observed.note_recorded([("sink", "10"), ("sink", str(count))])
    assert observed.recorded_here("sink", "10") and not observed.recorded_here("sink", "11")
    observed.forget_parsed()
    assert not observed.recorded_here("sink", str(count))
