"""The found write (app/usecases/checks/decide.py): a message the look
itself recorded is no signal's yet, so nobody is asked who took it; a
message recorded before is, and a signal of the same namespace that has it
keeps it. The sink's search tells which of its messages are recorded
(`ProviderMessage.recorded_id`), so the write does not ask that either; a
message recorded between the search and the write is still recorded once.
Whole looks made in this process on the test's own PostgreSQL and Redis
(the `looks` fixture)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event

from app.db import checks as checks_db
from app.db import messages as messages_db
from app.db.engine import get_engine, transaction
from app.providers import sink
from app.providers.base import SearchQuery
from app.usecases import signals
from app.usecases.checks import process_runner, record_messages
from tests.integration.looks import Looks, sql, store

pytestmark = pytest.mark.integration


class Asked:
    """`messages_db.message_taken`, its calls kept (message ids, namespace)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[list[str], str]] = []
        real = messages_db.message_taken

        def spy(session: Any, message_ids: Sequence[str], namespace: str) -> dict[str, str]:
            self.calls.append((list(message_ids), namespace))
            return real(session, message_ids, namespace)

        monkeypatch.setattr(messages_db, "message_taken", spy)


class Known:
    """`messages_db.message_ids_by_provider_id` (which messages are recorded
    already), its calls kept (provider ids)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[str]] = []
        real = messages_db.message_ids_by_provider_id

        def spy(session: Any, provider: str, provider_ids: Sequence[str]) -> dict[str, str]:
            self.calls.append(list(provider_ids))
            return real(session, provider, provider_ids)

        monkeypatch.setattr(messages_db, "message_ids_by_provider_id", spy)


class Savepoints:
    """The savepoints the engine's connections open, counted (the found
    write opens one around a take the unique index may refuse)."""

    def __init__(self) -> None:
        self.count = 0
        self.engine = get_engine()
        event.listen(self.engine, "savepoint", self._opened)

    def _opened(self, *args: Any) -> None:
        self.count += 1

    def close(self) -> None:
        event.remove(self.engine, "savepoint", self._opened)


@pytest.fixture
def savepoints(in_process: None) -> Iterator[Savepoints]:
    counted = Savepoints()
    yield counted
    counted.close()


def status_and_message(signal_id: str) -> tuple[str, str | None]:
    ((status, message_id),) = sql("SELECT status, message_id FROM signals WHERE id = %s", signal_id)
    return status, message_id


def an_address() -> str:
    return f"fw-{uuid.uuid4().hex[:8]}@example.test"


def a_minute_back() -> datetime:
    return datetime.now(UTC) - timedelta(minutes=1)


def test_a_message_the_look_recorded_is_taken_without_asking_who_has_it(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = Asked(monkeypatch)
    recipient = an_address()
    store(recipient)
    signal_id = looks.create(quick=False, recipient=recipient, received_after=a_minute_back())
    status, message_id = status_and_message(signal_id)
    assert status == "found" and message_id is not None
    assert asked.calls == []


def test_a_message_recorded_before_is_asked_after_and_stays_its_signals(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second signal's look sees the same sink message, recorded by the
    first's: it must learn that a signal of its namespace has it."""
    recipient = an_address()
    store(recipient)
    first = looks.create(quick=False, recipient=recipient, received_after=a_minute_back())
    _, message_id = status_and_message(first)
    asked = Asked(monkeypatch)
    second = looks.create(quick=False, recipient=recipient, received_after=a_minute_back())
    assert status_and_message(second) == ("waiting", None)
    assert status_and_message(first) == ("found", message_id)
    assert asked.calls == [([message_id], "default")]


def test_one_look_over_two_signals_gives_a_new_message_to_the_earlier_only(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both signals wait when the mail comes; one pushed look takes them
    together and records the mail: the earlier signal gets it, the later sees
    it taken within the look (no query, no unique-index collision)."""
    recipient = an_address()
    earlier = looks.create(look=False, recipient=recipient)
    later = looks.create(look=False, recipient=recipient)
    store(recipient)
    asked = Asked(monkeypatch)
    marks: list[str] = []
    real = checks_db.signal_mark_found

    def mark(session: Any, signal_id: str, *args: Any, **kwargs: Any) -> bool:
        marks.append(signal_id)
        return real(session, signal_id, *args, **kwargs)

    monkeypatch.setattr(checks_db, "signal_mark_found", mark)
    pushed = signals.push("sink", [recipient], runner=process_runner(looks.settings))
    assert sorted(pushed) == sorted([earlier, later])
    status, message_id = status_and_message(earlier)
    assert status == "found" and message_id is not None
    assert status_and_message(later) == ("waiting", None)
    assert marks == [earlier]  # the later one never tried the taken message
    assert asked.calls == []


def sink_ids(recipient: str) -> list[str]:
    return [
        str(i)
        for (i,) in sql(
            "SELECT id FROM sink_messages WHERE %s = ANY(all_recipients) ORDER BY id", recipient
        )
    ]


def our_ids(provider_ids: Sequence[str]) -> dict[str, str]:
    return dict(
        sql(
            "SELECT provider_message_id, id FROM messages"
            " WHERE provider = 'sink' AND provider_message_id = ANY(%s)",
            list(provider_ids),
        )
    )


def test_a_sink_look_never_asks_which_messages_are_recorded(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither when the look records the message (it is new) nor when a
    later signal's look sees it recorded: the search answered both."""
    known = Known(monkeypatch)
    recipient = an_address()
    store(recipient)
    first = looks.create(quick=False, recipient=recipient, received_after=a_minute_back())
    _, message_id = status_and_message(first)
    assert message_id is not None
    second = looks.create(quick=False, recipient=recipient, received_after=a_minute_back())
    assert status_and_message(second) == ("waiting", None)
    assert status_and_message(first) == ("found", message_id)
    assert known.calls == []
    assert list(our_ids(sink_ids(recipient)).values()) == [message_id]


@pytest.mark.parametrize("lookback", [False, True], ids=["window", "window-and-before"])
def test_the_sink_search_tells_our_id_for_each_recorded_message_on_every_page(
    in_process: None, monkeypatch: pytest.MonkeyPatch, lookback: bool
) -> None:
    """Three messages, read a page of one at a time (the first page and the
    pages after it are different statements); with `lookback` the window
    opens at the second, so the first comes as a near miss before it (the
    first page's other half). The two a check recorded carry our id, the
    other none, whichever part of the search read them."""
    monkeypatch.setattr(sink, "PAGE_SIZE", 1)
    recipient = an_address()
    for seconds in (30, 20, 10):
        store(recipient, at=f"now() - interval '{seconds} seconds'")
    ids = sink_ids(recipient)
    provider = sink.SinkProvider()
    since = datetime.now(UTC) - timedelta(minutes=1)
    everything = provider.search(SearchQuery(since=since, recipients=frozenset({recipient})))
    with transaction() as session:  # a check records the first and the last
        record_messages(
            session, "sink", [m for m in everything if m.provider_message_id in (ids[0], ids[2])]
        )
    recorded = our_ids(ids)
    assert sorted(recorded) == sorted([ids[0], ids[2]])
    window = since
    if lookback:
        ((window,),) = sql("SELECT received_at FROM sink_messages WHERE id = %s", int(ids[1]))
    query = SearchQuery(
        since=since - timedelta(minutes=1) if lookback else since,
        recipients=frozenset({recipient}),
        windows={recipient: window},
    )
    seen = {m.provider_message_id: m for m in provider.search(query)}
    assert sorted(seen) == sorted(ids)
    assert all(m.recorded_known for m in seen.values())
    assert {pid: m.recorded_id for pid, m in seen.items()} == {
        ids[0]: recorded[ids[0]],
        ids[1]: None,
        ids[2]: recorded[ids[2]],
    }


def test_a_message_recorded_between_the_search_and_the_write_is_recorded_once(
    in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search said nobody had recorded it; another check recorded it
    before this one wrote: this check records nothing more, gets that id,
    and does not count it as its own (so the write asks who has it)."""
    recipient = an_address()
    store(recipient)
    query = SearchQuery(
        since=datetime.now(UTC) - timedelta(minutes=1), recipients=frozenset({recipient})
    )
    (seen,) = sink.SinkProvider().search(query)
    assert seen.recorded_known and seen.recorded_id is None
    with transaction() as session:  # the other check, committed first
        (other,) = record_messages(session, "sink", [seen])
    assert other.recorded_now
    known = Known(monkeypatch)
    with transaction() as session:
        (mine,) = record_messages(session, "sink", [seen])
    assert mine.message_id == other.message_id
    assert not mine.recorded_now
    assert known.calls == [[seen.provider_message_id]]  # asked only after its insert did nothing
    assert our_ids([seen.provider_message_id]) == {seen.provider_message_id: other.message_id}


def test_new_messages_are_recorded_in_chunks_and_only_one_recorded_meanwhile_is_asked(
    in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three new messages, inserted two per statement: each insert returns
    the ids it recorded; the one another check recorded first is the only
    one read back, and the only one not counted as this check's own."""
    monkeypatch.setattr(messages_db, "INSERT_CHUNK", 2)
    recipient = an_address()
    for seconds in (30, 20, 10):
        store(recipient, at=f"now() - interval '{seconds} seconds'")
    query = SearchQuery(
        since=datetime.now(UTC) - timedelta(minutes=1), recipients=frozenset({recipient})
    )
    seen = sink.SinkProvider().search(query)
    assert len(seen) == 3 and all(m.recorded_known and m.recorded_id is None for m in seen)
    with transaction() as session:  # another check records the middle one first
        (other,) = record_messages(session, "sink", [seen[1]])
    known = Known(monkeypatch)
    with transaction() as session:
        mine = record_messages(session, "sink", seen)
    assert [o.message.provider_message_id for o in mine] == [m.provider_message_id for m in seen]
    assert [o.recorded_now for o in mine] == [True, False, True]
    assert mine[1].message_id == other.message_id
    assert known.calls == [[seen[1].provider_message_id]]
    assert our_ids([m.provider_message_id for m in seen]) == {
        o.message.provider_message_id: o.message_id for o in mine
    }


def test_a_message_the_look_recorded_is_taken_without_a_savepoint(
    looks: Looks, savepoints: Savepoints
) -> None:
    recipient = an_address()
    signal_id = looks.create(look=False, recipient=recipient)
    store(recipient)
    signals.push("sink", [recipient], runner=process_runner(looks.settings))
    status, message_id = status_and_message(signal_id)
    assert status == "found" and message_id is not None
    assert savepoints.count == 0


def test_a_message_recorded_by_an_earlier_look_is_taken_under_a_savepoint(
    looks: Looks, savepoints: Savepoints
) -> None:
    """The first signal's look records the mail as a near miss (its subject
    does not match); the second signal's look takes the recorded message,
    which the unique index may refuse (a signal elsewhere took it): under a
    savepoint, so a refusal costs only that take."""
    recipient = an_address()
    store(recipient)
    missed = looks.create(
        quick=False,
        recipient=recipient,
        received_after=a_minute_back(),
        subject_contains="no such subject",
    )
    assert status_and_message(missed) == ("waiting", None)
    assert savepoints.count == 0
    second = looks.create(quick=False, recipient=recipient, received_after=a_minute_back())
    status, message_id = status_and_message(second)
    assert status == "found" and message_id is not None
    assert savepoints.count == 1
