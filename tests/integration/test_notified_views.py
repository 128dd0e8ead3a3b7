"""A long poll woken by a signal that stopped waiting answers with the view
its notification carries (migration 0018, `signals.signal_view_notified`):
exactly the view a read gives, for operators masked as a read masks it; an
expiry, and a view too large for a notification, are notified by id alone
and read again. Looks made in this process on the test's own PostgreSQL
(the `looks` fixture), the notifications taken by a real LISTEN."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from app.settings import get_settings
from app.usecases import signals
from app.usecases.checks import process_runner
from tests.integration.looks import Looks, sql, store

pytestmark = pytest.mark.integration

END = "end of the changes"


@pytest.fixture
def notified(looks: Looks) -> Iterator[Callable[[], dict[str, list[str]]]]:
    """LISTENs from here on; called, it gives every payload notified since,
    by signal id, in commit order."""
    url = str(get_settings().database_url)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN signalbox_signal")

        def taken() -> dict[str, list[str]]:
            sql(f"NOTIFY signalbox_signal, '{END}'")  # after every change of the test
            out: dict[str, list[str]] = {}
            for note in listener.notifies(timeout=30.0):
                if note.payload == END:
                    return out
                out.setdefault(note.payload.partition(" ")[0], []).append(note.payload)
            raise AssertionError(f"the end marker never came; got {out}")

        yield taken


def _found(looks: Looks, subject: str | None = None, **fields: object) -> str:
    recipient = f"n-{uuid.uuid4().hex[:8]}@example.test"
    signal_id = looks.create(recipient=recipient, **fields)
    store(recipient, subject=subject or f"Your code {uuid.uuid4().hex[:6]} is here")
    signals.push("sink", [recipient], runner=process_runner(looks.settings))
    return signal_id


def test_a_found_signal_is_notified_with_the_view_a_read_gives(
    looks: Looks, notified: Callable[[], dict[str, list[str]]]
) -> None:
    signal_id = _found(
        looks,
        subject_contains="Your code",
        metadata={"user": "ümlaut ✓", "n": 1.5, "nested": {"a": [1, None, True]}},
        test_case='a case "quoted" and \\ back-slashed',
    )

    (payload,) = notified()[signal_id]

    read = signals.signal_read("default", signal_id)
    assert read["status"] == "found" and read["message"] is not None
    assert signals.signal_view_notified(payload) == read
    # An operator's long poll gets the view masked as an operator's read is.
    masked = signals.signal_view_notified(payload, masked=True)
    assert masked == signals.signal_read(None, signal_id, masked=True)
    assert masked != read


def test_an_arrived_signal_is_notified_with_its_view_and_recommendation(
    looks: Looks, notified: Callable[[], dict[str, list[str]]]
) -> None:
    """`expect: none` and a matching message came: `arrived`, whose view
    says how long after its window began the message came (the message's
    and the window's timestamps, both from the notification)."""
    signal_id = _found(looks, expect="none")

    (payload,) = notified()[signal_id]

    read = signals.signal_read("default", signal_id)
    assert read["status"] == "arrived" and read["recommendation"]
    assert signals.signal_view_notified(payload) == read


def test_an_expired_signal_is_notified_by_id_and_read_again(
    looks: Looks, notified: Callable[[], dict[str, list[str]]]
) -> None:
    """An expired signal's view shows its dead letter, written after the
    expiry: its notification is the id alone, and the long poll reads."""
    signal_id = looks.create()
    sql(
        "UPDATE signals SET status = 'expired', expiry_reason = 'deadline' WHERE id = %s",
        signal_id,
    )

    assert notified()[signal_id] == [signal_id]
    assert signals.signal_view_notified(signal_id) is None


def test_a_view_too_large_for_a_notification_is_notified_by_id_and_the_found_commits(
    looks: Looks, notified: Callable[[], dict[str, list[str]]]
) -> None:
    """PostgreSQL refuses a notification of 8,000 bytes or more, and a
    refused one would fail the transaction that found the message: a signal
    whose view does not fit (4 KiB of metadata, and 1,000 two-byte
    characters looked for in the subject and found there) is notified by id
    alone, and found all the same."""
    wanted = "é" * 1000
    signal_id = _found(
        looks,
        subject=f"Your {wanted} is here",
        subject_contains=wanted,
        metadata={"blob": "x" * 4000},
    )

    ((status,),) = sql("SELECT status FROM signals WHERE id = %s", signal_id)
    assert status == "found"
    assert notified()[signal_id] == [signal_id]
    assert signals.signal_view_notified(signal_id) is None


def test_a_view_needing_the_database_is_not_made_from_a_notification(
    looks: Looks, notified: Callable[[], dict[str, list[str]]]
) -> None:
    """A row whose view would ask the database (here a `claimed` one, as a
    later change could make it) gives no view from the notification."""
    signal_id = _found(looks)
    (payload,) = notified()[signal_id]

    claimed = payload.replace('"status":"found"', '"status":"claimed"', 1)
    assert claimed != payload
    assert signals.signal_view_notified(claimed) is None
