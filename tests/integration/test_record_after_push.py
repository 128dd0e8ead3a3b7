"""The sink's inbox record after a push (`intake.record_stored`) leaves out
the messages the push's look recorded, once that look's transaction
committed: it neither sends their bytes again nor opens a transaction for
them. A message no look recorded (no signal waits for it), or one whose
look's write was undone, is recorded by it as before. Looks made in this
process on the test's own PostgreSQL and Redis (the `looks` fixture)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from app.db import checks as checks_db
from app.settings import get_settings
from app.usecases import intake
from app.usecases.checks import CheckRunner, process_runner
from app.usecases.checks.observed import recorded_here
from tests.integration.helpers import mail
from tests.integration.looks import Looks, sql

pytestmark = pytest.mark.integration


class Tasks:
    """The tasks a failed check would send, kept instead."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def check(self, signal_id: str) -> None:
        self.sent.append(signal_id)

    def first_look(self, provider: str, signal_id: str) -> None:
        self.sent.append(signal_id)

    def first_look_started(self, signal_id: str) -> None:
        pass


def an_address() -> str:
    return f"rp-{uuid.uuid4().hex[:8]}@example.test"


def deliver(recipient: str) -> tuple[list[intake.StoredMail], list[intake.Received]]:
    """One message stored by the sink's store, not yet pushed or recorded."""
    received: list[intake.Received] = [("app@example.test", [recipient], mail(recipient))]
    return intake.store_many(get_settings(), received), received


def waiting_and_delivered(
    looks: Looks,
) -> tuple[str, str, list[intake.StoredMail], list[intake.Received]]:
    """A waiting signal (its first look made) and one message to it, stored:
    (signal id, its recipient, the store's answer, what was received)."""
    recipient = an_address()
    signal_id = looks.create(recipient=recipient)
    stored, received = deliver(recipient)
    return signal_id, recipient, stored, received


def recorded(stored: list[intake.StoredMail]) -> list[tuple[Any, ...]]:
    return sql(
        "SELECT id FROM messages WHERE provider = 'sink' AND provider_message_id = %s",
        str(stored[0].sink_id),
    )


def status(signal_id: str) -> str:
    ((value,),) = sql("SELECT status FROM signals WHERE id = %s", signal_id)
    return str(value)


def no_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> None:
        raise AssertionError("the inbox record opened a transaction")

    monkeypatch.setattr(intake, "transaction", refused)


def test_a_message_the_push_recorded_is_not_recorded_again(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    signal_id, recipient, stored, received = waiting_and_delivered(looks)
    settings = get_settings()

    intake.push(settings, [stored[0].sink_id], [recipient], runner=process_runner(settings))

    assert status(signal_id) == "found"
    assert recorded_here("sink", str(stored[0].sink_id))
    ((message_id,),) = recorded(stored)
    no_transaction(monkeypatch)
    intake.record_stored(settings, stored, received)  # nothing left to send
    assert recorded(stored) == [(message_id,)]


def test_a_message_no_look_recorded_is_recorded_by_the_inbox_record(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = get_settings()
    stored, received = deliver(an_address())  # no signal waits for it
    intake.push(settings, [stored[0].sink_id], [received[0][1][0]], runner=process_runner(settings))

    assert not recorded_here("sink", str(stored[0].sink_id))
    assert recorded(stored) == []
    intake.record_stored(settings, stored, received)
    assert recorded(stored) == [(stored[0].message_id,)]


def test_a_look_whose_write_was_undone_leaves_its_message_to_the_record(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    signal_id, recipient, stored, received = waiting_and_delivered(looks)
    settings = get_settings()
    real = process_runner(settings)
    tasks = Tasks()
    runner = CheckRunner(
        settings, providers=real.deps.providers, breakers=real.deps.breakers, tasks=tasks
    )

    def fails(*args: Any, **kwargs: Any) -> bool:
        # After the look recorded the message, in the same transaction.
        raise RuntimeError("the found write failed")

    with monkeypatch.context() as patch:
        patch.setattr(checks_db, "signal_mark_found", fails)
        intake.push(settings, [stored[0].sink_id], [recipient], runner=runner)

    # The write was undone, the message with it; the check is left to a task.
    assert tasks.sent and status(signal_id) == "waiting"
    assert not recorded_here("sink", str(stored[0].sink_id))
    assert recorded(stored) == []
    intake.record_stored(settings, stored, received)
    assert recorded(stored) == [(stored[0].message_id,)]
