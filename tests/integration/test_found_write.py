"""The found write (app/usecases/checks/decide.py): a message the look
itself recorded is no signal's yet, so nobody is asked who took it; a
message recorded before is, and a signal of the same namespace that has it
keeps it. Whole looks made in this process on the test's own PostgreSQL and
Redis (the `looks` fixture)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.db import checks as checks_db
from app.db import messages as messages_db
from app.usecases import signals
from app.usecases.checks import in_process_check_for
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
    pushed = signals.push("sink", [recipient], check_here=in_process_check_for(looks.settings))
    assert sorted(pushed) == sorted([earlier, later])
    status, message_id = status_and_message(earlier)
    assert status == "found" and message_id is not None
    assert status_and_message(later) == ("waiting", None)
    assert marks == [earlier]  # the later one never tried the taken message
    assert asked.calls == []
