"""Behind a backlog the sweep makes the sink's held-back final looks itself
(`app/usecases/sweep.py:_owed_final_looks`, `takes.signal_lock_owed_finals`):
a signal whose deadline passed while backoff steps due before it filled every
batch gets its final look before expiry can give it up unseen. Looks made in
this process on the test's own PostgreSQL and Redis (the `looks` fixture)."""

from __future__ import annotations

from typing import Any

import pytest

from app.db import takes as takes_db
from app.db.engine import autocommit
from app.usecases import sweep
from app.usecases.checks import BATCH_LIMIT, process_runner
from tests.integration.looks import Looks, sql, store

pytestmark = pytest.mark.integration


def past_deadline(signal_id: str, *, ago: float, looked: str = "before") -> None:
    """Move `signal_id`'s window back: its deadline `ago` s past, its final
    look due since, its last look begun before the deadline (or after it)."""
    last_look = "expires_at - interval '20 seconds'" if looked == "before" else "expires_at"
    sql(
        "UPDATE signals SET received_after = now() - make_interval(secs => %s + 120),"
        " expires_at = now() - make_interval(secs => %s),"
        " next_check_at = now() - make_interval(secs => %s), next_check_reason = 'scheduled'"
        " WHERE id = %s",
        ago,
        ago,
        ago,
        signal_id,
    )
    sql(f"UPDATE signals SET last_look_at = {last_look} WHERE id = %s", signal_id)


def owed(late: float = 5.0) -> list[Any]:
    with autocommit() as session:
        return takes_db.signal_lock_owed_finals(
            session, "sink", late_seconds=late, lease_seconds=30, batch_limit=10
        )


def test_only_final_looks_held_back_past_the_deadline_are_owed_oldest_first(
    looks: Looks,
) -> None:
    older, newer, just_past, looked, leased, before = (looks.create() for _ in range(6))
    past_deadline(older, ago=60)
    past_deadline(newer, ago=30)
    past_deadline(just_past, ago=2)  # not `late` yet: the sweep's due checks take it
    past_deadline(looked, ago=60, looked="after")  # its final look began: expiry decides
    past_deadline(leased, ago=60)
    sql(
        "UPDATE signals SET check_lease_until = now() + interval '30 seconds' WHERE id = %s", leased
    )
    sql("UPDATE signals SET next_check_at = now() WHERE id = %s", before)  # deadline ahead

    taken = owed()

    assert [r["id"] for r in taken] == [older, newer]
    assert all(r["looked_at"] >= r["expires_at"] for r in taken)  # final looks
    assert owed() == []  # leased now: a second sweep does not take them again


def test_behind_a_backlog_the_sweep_finds_the_mail_of_a_held_back_final_look(
    looks: Looks,
) -> None:
    """A batch's worth of backoff steps, due ten minutes before a signal's
    deadline, fills the check the sweep's due signals get: without the owed
    looks that signal's final look waits behind them, though its mail arrived
    before its deadline."""
    backlog = [looks.create() for _ in range(BATCH_LIMIT + 1)]
    sql(
        "UPDATE signals SET next_check_at = now() - interval '10 minutes',"
        " next_check_reason = 'scheduled' WHERE id = ANY(%s)",
        backlog,
    )
    recipient = "held-back@example.test"
    signal_id = looks.create(recipient=recipient)
    past_deadline(signal_id, ago=30)
    store(recipient, at="now() - interval '60 seconds'")  # 30 s before the deadline

    sweep.sweep(looks.settings, limit=1, runner=process_runner(looks.settings))

    assert sql("SELECT status FROM signals WHERE id = %s", signal_id) == [("found",)]
