"""A push made in this process takes its signals in the push's own round trip
(`app/db/takes.py:signal_push_and_lock`): the push's statement and the
check's lock are sent together and committed once. The pushed signals are
taken first, one under another check's lease is pushed but not taken, the
look that follows is made once (its look began after the push), and an
error in the take undoes the push. Looks made in this process on the test's
own PostgreSQL and Redis (the `looks` fixture)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.exc import DBAPIError

from app.db import runner
from app.db import takes as takes_db
from app.db.engine import autocommit
from app.usecases import signals
from app.usecases.checks import CheckReport, CheckRequest, CheckRunner, Why, process_runner
from tests.integration.looks import Looks, sql, store

pytestmark = pytest.mark.integration


def an_address() -> str:
    return f"pt-{uuid.uuid4().hex[:8]}@example.test"


def push_and_lock(recipients: list[str], *, batch_limit: int = 10) -> tuple[list[str], list[Any]]:
    with autocommit() as session:
        pushed, taken = takes_db.signal_push_and_lock(
            session,
            "sink",
            recipients,
            limit=200,
            lease_seconds=30,
            batch_limit=batch_limit,
            coalesce_seconds=0,
        )
    return [signal_id for signal_id, _ in pushed], taken


def row(signal_id: str) -> dict[str, Any]:
    ((fence, reason, leased, enqueued),) = sql(
        "SELECT check_fence, next_check_reason, check_lease_until > now(), enqueued_at"
        " FROM signals WHERE id = %s",
        signal_id,
    )
    return {"fence": fence, "reason": reason, "leased": leased, "enqueued_at": enqueued}


def test_the_pushed_signals_are_taken_first_and_one_under_a_lease_is_only_pushed(
    looks: Looks,
) -> None:
    recipient = an_address()
    pushed_one = looks.create(recipient=recipient)
    leased = looks.create(recipient=recipient)
    overdue = looks.create()  # another recipient, due by its schedule for a while
    sql("UPDATE signals SET next_check_at = now() - interval '1 minute' WHERE id = %s", overdue)
    sql(
        "UPDATE signals SET check_lease_until = now() + interval '30 seconds' WHERE id = %s", leased
    )
    before = {s: row(s) for s in (pushed_one, leased, overdue)}

    # One row per check: the pushed recipient's signal comes before the
    # signal that has been due longer.
    pushed, taken = push_and_lock([recipient.upper()], batch_limit=1)

    assert sorted(pushed) == sorted([pushed_one, leased])
    assert [r["id"] for r in taken] == [pushed_one]
    after = row(pushed_one)
    assert after["fence"] == before[pushed_one]["fence"] + 1 and after["leased"]
    assert after["reason"] == "push"
    # The look began after the push: its write will not take the push for
    # one made while it looked, and look again.
    assert taken[0]["looked_at"] > after["enqueued_at"]
    # Under another check's lease: pushed (that check looks again), not taken.
    assert row(leased)["reason"] == "push" and row(leased)["fence"] == before[leased]["fence"]
    assert row(overdue)["fence"] == before[overdue]["fence"]

    # A push that made nothing due takes nothing, not even a due signal.
    again, taken = push_and_lock([an_address()])
    assert (again, taken) == ([], [])
    assert row(overdue)["fence"] == before[overdue]["fence"]
    # With room in the batch the due signal rides along, as with any lock.
    other = looks.create()
    again, taken = push_and_lock([sql("SELECT recipient FROM signals WHERE id = %s", other)[0][0]])
    assert again == [other]
    assert [r["id"] for r in taken] == [other, overdue]


def test_an_error_in_the_take_undoes_the_push(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No signal is left pushed by a statement whose take failed, and none
    leased without its look."""
    recipient = an_address()
    signal_id = looks.create(recipient=recipient)
    before = row(signal_id)
    monkeypatch.setattr(
        takes_db,
        "_LOCK_PUSHED",
        runner.variant("test_lock_fails", "SELECT 1 / (:limit - :limit) AS n"),
    )
    with pytest.raises(DBAPIError):
        push_and_lock([recipient])
    assert row(signal_id) == before


def test_a_push_made_here_finds_the_mail_with_one_take_and_one_look(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """signals.push with the sink's in-process check: the push's round trip
    takes the signal, no separate lock is made, and the signal has exactly
    two checks, its first look and the push's, which found the mail."""
    recipient = an_address()
    signal_id = looks.create(recipient=recipient)
    store(recipient)
    locks: list[str] = []
    real = takes_db.signal_lock_for_check

    def lock(session: Any, signal_id: str, **kwargs: Any) -> list[Any]:
        locks.append(signal_id)
        return real(session, signal_id, **kwargs)

    monkeypatch.setattr(takes_db, "signal_lock_for_check", lock)
    pushed = signals.push("sink", [recipient], runner=process_runner(looks.settings))

    assert pushed == [signal_id]
    assert locks == []
    assert sql("SELECT status FROM signals WHERE id = %s", signal_id) == [("found",)]
    assert sql(
        "SELECT reason, outcome FROM checks WHERE signal_id = %s ORDER BY fence", signal_id
    ) == [("first", "no_match"), ("push", "matched")]


class Counted(CheckRunner):
    """The sink's check runner, its looks counted."""

    looked: list[str]

    def check(self, request: CheckRequest) -> CheckReport | None:
        self.looked.append(request.signal_id)
        return super().check(request)


def test_a_push_with_no_signal_waiting_takes_nothing_and_looks_at_nothing(looks: Looks) -> None:
    real = process_runner(looks.settings)
    runner = Counted(looks.settings, providers=real.deps.providers, breakers=real.deps.breakers)
    runner.looked = []
    assert signals.push("sink", [an_address()], runner=runner) == []
    assert runner.looked == []
    recipient = an_address()
    signal_id = looks.create(recipient=recipient)
    assert signals.push("sink", [recipient], runner=runner) == [signal_id]
    assert runner.looked == [signal_id]  # one look, with what the push took


def test_a_check_fenced_out_by_a_redrive_writes_no_near_misses(looks: Looks) -> None:
    """A check whose signal was redriven while it looked (the redrive moves
    the fence on) writes nothing, its near misses included; the next check,
    under the new fence, writes them."""
    recipient = an_address()
    signal_id = looks.create(recipient=recipient, subject_contains="the-one", look=False)
    store(recipient, subject="not it")
    _, taken = push_and_lock([recipient])
    assert [r["id"] for r in taken] == [signal_id]
    # What a redrive does to a check in flight (app/db/signals.py:signal_redrive).
    sql("UPDATE signals SET check_fence = check_fence + 1 WHERE id = %s", signal_id)
    runner = process_runner(looks.settings)
    runner.check(CheckRequest(signal_id, Why.PUSH, "sink", taken=taken))
    assert sql("SELECT count(*) FROM near_misses WHERE signal_id = %s", signal_id) == [(0,)]
    assert sql("SELECT count(*) FROM checks WHERE signal_id = %s", signal_id) == [(0,)]

    sql("UPDATE signals SET check_lease_until = NULL WHERE id = %s", signal_id)
    runner.check(CheckRequest(signal_id, Why.PUSH, "sink"))
    assert sql("SELECT why FROM near_misses WHERE signal_id = %s", signal_id) == [
        ("subject_mismatch",)
    ]
