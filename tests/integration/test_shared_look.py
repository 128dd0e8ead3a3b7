"""A look over many signals (one address a suite shares, or a polled
provider's batch) writes their results together
(app/usecases/checks/decide.py): the signals' check rows and near misses in
one statement each, whatever the number of signals (and again after a
signal found, whose take must lock it after the older ones); each signal
fenced on its own; a push that came meanwhile kept; the signals locked in
the order a push locks them; an expiry in the same look still carrying its
near misses; another namespace still seeing free a message one namespace
saw taken. Whole looks made in this process on the test's own PostgreSQL
and Redis (the `looks` fixture)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from app.db import checks as checks_db
from app.db import messages as messages_db
from app.db import takes as takes_db
from app.db.checks import CheckRecord, CheckWrite
from app.db.engine import autocommit, transaction
from app.settings import get_settings
from app.usecases import signals
from app.usecases.checks import process_runner
from tests.integration.looks import Looks, sql, store

pytestmark = pytest.mark.integration

SIGNALS = 25


def an_address() -> str:
    return f"shared-{uuid.uuid4().hex[:8]}@example.test"


class Calls:
    """How many times each of the look's writes was called (the real one runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count: dict[str, int] = {}
        self.sizes: dict[str, list[int]] = {}
        for module, name in (
            (checks_db, "signal_record_check"),
            (checks_db, "signal_record_checks"),
            (messages_db, "near_misses_record"),
            (messages_db, "near_miss_record_many"),
        ):
            monkeypatch.setattr(module, name, self._counted(name, getattr(module, name)))

    def _counted(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def spy(session: Any, *args: Any, **kwargs: Any) -> Any:
            self.count[name] = self.count.get(name, 0) + 1
            if args and isinstance(args[0], list):
                self.sizes.setdefault(name, []).append(len(args[0]))
            return real(session, *args, **kwargs)

        return spy


def test_a_look_over_many_signals_writes_their_checks_and_near_misses_in_a_few_statements(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipient = an_address()
    ids = [
        looks.create(look=False, recipient=recipient, subject_contains=f"code-{i:03d}")
        for i in range(SIGNALS)
    ]
    for subject in ("Weekly digest", "Your code-007 is here", "Newsletter"):
        store(recipient, subject=subject)
    calls = Calls(monkeypatch)

    pushed = signals.push("sink", [recipient], runner=process_runner(looks.settings))

    assert sorted(pushed) == sorted(ids)
    winner = ids[7]
    ((status,),) = sql("SELECT status FROM signals WHERE id = %s", winner)
    assert status == "found"
    # One look: the writes held until the found one (whose take locks it, so
    # the seven older signals are written first), then the other 17 together.
    assert calls.count == {"signal_record_checks": 2, "near_misses_record": 2}
    assert calls.sizes["signal_record_checks"] == [7, SIGNALS - 8]
    assert calls.sizes["near_misses_record"] == [7 * 3 + 2, (SIGNALS - 8) * 3]
    checks = sql(
        "SELECT signal_id, reason, outcome, counted, messages_seen, batch_id FROM checks"
        " WHERE signal_id = ANY(%s)",
        ids,
    )
    assert len(checks) == SIGNALS  # one each, this look's
    assert len({c[5] for c in checks}) == 1  # one batch
    others = {c[0]: c[1:5] for c in checks if c[0] != winner}
    assert others == dict.fromkeys(set(ids) - {winner}, ("push", "no_match", False, 3))
    states = sql(
        "SELECT s.id, s.status, s.last_outcome, s.check_lease_until IS NULL,"
        " s.last_look_at = c.started_at, s.next_check_at > clock_timestamp()"
        " FROM signals s JOIN checks c ON c.signal_id = s.id WHERE s.id = ANY(%s)",
        [i for i in ids if i != winner],
    )
    assert {s[1:] for s in states} == {("waiting", "no_match", True, True, True)}
    misses = sql(
        "SELECT n.signal_id, m.subject, n.why FROM near_misses n"
        " JOIN messages m ON m.id = n.message_id WHERE n.signal_id = ANY(%s)",
        ids,
    )
    by_signal: dict[str, set[tuple[str, str]]] = {}
    for signal_id, subject, why in misses:
        by_signal.setdefault(signal_id, set()).add((subject, why))
    everything = {
        ("Weekly digest", "subject_mismatch"),
        ("Your code-007 is here", "subject_mismatch"),
        ("Newsletter", "subject_mismatch"),
    }
    assert by_signal[winner] == everything - {("Your code-007 is here", "subject_mismatch")}
    assert all(by_signal[i] == everything for i in ids if i != winner)


def test_each_signal_of_a_write_is_fenced_on_its_own_and_keeps_a_push_that_came_meanwhile(
    looks: Looks,
) -> None:
    """Three signals taken by one check: meanwhile another check took the
    second (its fence moved) and a push made the third due. The write, given
    in the reverse order, writes the first and the third, keeps the third's
    push, and leaves the second to the check that holds it."""
    recipient = an_address()
    first, second, third = (looks.create(look=False, recipient=recipient) for _ in range(3))
    with autocommit() as session:
        taken = takes_db.signal_lock_for_check(session, first, lease_seconds=30, batch_limit=10)
    assert {r["id"] for r in taken} == {first, second, third}
    fences = {r["id"]: r["check_fence"] for r in taken}
    started = taken[0]["looked_at"]
    sql("UPDATE signals SET check_fence = check_fence + 1 WHERE id = %s", second)
    sql(
        "UPDATE signals SET enqueued_at = clock_timestamp(), next_check_at = clock_timestamp(),"
        " next_check_reason = 'push' WHERE id = %s",
        third,
    )
    record = CheckRecord(
        reason="push",
        outcome="no_match",
        error_code=None,
        batch_id="chk_fenced",
        started_at=started,
        counted=False,
        messages_seen=0,
    )
    later = started + timedelta(minutes=5)

    with transaction() as session:
        written = checks_db.signal_record_checks(
            session,
            [
                CheckWrite(i, fences[i], record, 0, later, "scheduled")
                for i in (third, second, first)
            ],
        )

    assert written == {first: False, third: True}
    rows = dict(
        (r[0], r[1:])
        for r in sql(
            "SELECT id, next_check_at = %s, next_check_reason, check_lease_until IS NULL,"
            " (SELECT count(*) FROM checks c WHERE c.signal_id = s.id)"
            " FROM signals s WHERE id = ANY(%s)",
            later,
            [first, second, third],
        )
    )
    assert rows[first] == (True, "scheduled", True, 1)
    assert rows[second] == (False, "first", False, 0)  # still the other check's
    assert rows[third] == (False, "push", True, 1)  # due again: the push is not lost


def test_a_signal_expiring_in_a_shared_look_keeps_its_near_misses_in_its_dead_letter(
    looks: Looks,
) -> None:
    """The first signal's deadline has passed when the push look comes; the
    others wait longer. The first expires in the same transaction that
    holds the others' writes back, and its dead letter names the mail that
    came in time and was not its own."""
    recipient = an_address()
    dying = looks.create(
        look=False, recipient=recipient, subject_contains="code-dying", expires_in_seconds=2
    )
    others = [
        looks.create(look=False, recipient=recipient, subject_contains=f"code-{i}")
        for i in range(4)
    ]
    store(recipient, subject="Welcome aboard")
    store(recipient, subject="Your code-2 is here")
    ((deadline,),) = sql("SELECT expires_at - clock_timestamp() FROM signals WHERE id = %s", dying)
    time.sleep(max(0.0, deadline.total_seconds()) + 0.2)

    signals.push("sink", [recipient], runner=process_runner(looks.settings))

    ((status, reason),) = sql("SELECT status, expiry_reason FROM signals WHERE id = %s", dying)
    assert (status, reason) == ("expired", "deadline")
    ((near,),) = sql("SELECT near_misses FROM dead_letters WHERE signal_id = %s", dying)
    assert sorted(n["why"] for n in near) == ["subject_mismatch", "subject_mismatch"]
    statuses = dict(sql("SELECT id, status FROM signals WHERE id = ANY(%s)", others))
    assert statuses == {
        others[0]: "waiting",
        others[1]: "waiting",
        others[2]: "found",
        others[3]: "waiting",
    }
    ((seen,),) = sql("SELECT count(*) FROM near_misses WHERE signal_id = ANY(%s)", others)
    assert seen == 2 * 3 + 1  # both mails for the three waiting, the welcome for the found one


def test_a_write_locks_its_signals_in_the_order_a_push_does(looks: Looks) -> None:
    """A push locks the waiting signals of an address oldest first. The
    write, given the signals newest first, must lock them oldest first too:
    otherwise, with a push holding the older one and about to take the
    newer, each would wait for the other (a deadlock, one of them aborted)."""
    recipient = an_address()
    older, newer = (looks.create(look=False, recipient=recipient) for _ in range(2))
    with autocommit() as session:
        taken = takes_db.signal_lock_for_check(session, older, lease_seconds=30, batch_limit=10)
    fences = {r["id"]: r["check_fence"] for r in taken}
    record = CheckRecord(
        reason="push",
        outcome="no_match",
        error_code=None,
        batch_id="chk_order",
        started_at=taken[0]["looked_at"],
        counted=False,
        messages_seen=0,
    )
    later = record.started_at + timedelta(minutes=5)
    outcome: dict[str, Any] = {}

    def write() -> None:
        try:
            with transaction() as session:
                outcome["written"] = checks_db.signal_record_checks(
                    session,
                    [
                        CheckWrite(i, fences[i], record, 0, later, "scheduled")
                        for i in (newer, older)
                    ],
                )
        except Exception as exc:  # reported below
            outcome["error"] = exc

    with psycopg.connect(str(looks.settings.database_url)) as push:
        push.execute("SET lock_timeout = '10s'")
        push.execute("SELECT id FROM signals WHERE id = %s FOR UPDATE", [older])
        writer = threading.Thread(target=write)
        writer.start()
        waited = 0.0
        while not sql(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%%jsonb_to_recordset%%'"
        ):
            assert waited < 10, "the write never waited for the push's lock"
            time.sleep(0.05)
            waited += 0.05
        # The push goes on to the newer signal: free, since the write waits
        # for the older one before it takes any.
        push.execute("SELECT id FROM signals WHERE id = %s FOR UPDATE", [newer])
        push.commit()
        writer.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["written"] == {older: False, newer: False}


def test_a_message_one_namespace_sees_taken_stays_free_for_another_in_the_same_look(
    in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a shared address, two signals of one namespace and one of another
    wait for the same mail, and one look decides all three. The first takes
    it, the second sees it taken; the other namespace's signal, decided after
    them over the same messages, must still see it free and take it."""
    monkeypatch.setenv("SIGNALBOX_SHARED_ADDRESSES", "@shared.test")
    get_settings.cache_clear()
    looks = Looks()
    recipient = f"qa-{uuid.uuid4().hex[:8]}@shared.test"
    first, second = (
        looks.create(look=False, recipient=recipient, namespace="team-a") for _ in range(2)
    )
    other = looks.create(look=False, recipient=recipient, namespace="team-b")
    store(recipient)

    signals.push("sink", [recipient], runner=process_runner(looks.settings))

    rows = dict(
        (r[0], r[1:])
        for r in sql(
            "SELECT id, status, message_id FROM signals WHERE id = ANY(%s)",
            [first, second, other],
        )
    )
    assert rows[first][0] == "found" and rows[other][0] == "found"
    assert rows[first][1] == rows[other][1]  # the one mail, once per namespace
    assert rows[second] == ("waiting", None)
    ((why,),) = sql("SELECT why FROM near_misses WHERE signal_id = %s", second)
    assert why == "taken_by_other_signal"
