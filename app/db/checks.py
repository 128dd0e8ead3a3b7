"""Repository of checks (`checks`) and the check protocol's writes to `signals`.

A check takes its signals with `FOR UPDATE SKIP LOCKED`, stamps a lease and
a new fence (`app/db/takes.py`), commits, calls the provider with no lock
held, then writes its result guarded by the fence: the signal's update
and the check's row in one statement (`signal_record_check`, or
`signal_record_checks` for all the signals of a look that found nothing;
`signal_mark_found`). A write whose fence no longer holds writes nothing.
Also here: a signal's checks, listed and counted by outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.pagination import Keyset
from app.db.records import CheckRow
from app.db.runner import Statement
from app.domain.states import ABSENCE, FIND, Transition


@dataclass(frozen=True)
class CheckRecord:
    """The check row a check's write adds beside the signal's update."""

    reason: str
    outcome: str
    error_code: str | None
    batch_id: str | None
    started_at: datetime
    counted: bool
    messages_seen: int | None = None

    def params(self) -> dict[str, Any]:
        return {
            "c_seen": self.messages_seen,
            "c_reason": self.reason,
            "c_outcome": self.outcome,
            "c_error": self.error_code,
            "c_batch": self.batch_id,
            "c_started": self.started_at,
            "c_counted": self.counted,
        }


# Appended to a fenced `UPDATE signals … RETURNING id, generation, provider`
# named `upd`: the check row is written by the same statement, and only when
# the fence held (one row per fence: a second write is a no-op).
_CHECK_ROW = """
    , chk AS (
        INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,
                            error_code, batch_id, started_at, counted, messages_seen)
        SELECT upd.id, upd.generation, :fence, upd.provider, :c_reason, :c_outcome,
               :c_error, :c_batch, :c_started, :c_counted, :c_seen
          FROM upd
        ON CONFLICT (signal_id, fence) DO NOTHING
    )
"""


# A check that found nothing, for any signals of one look: its row and its
# effect on each signal, in one statement, each guarded by its fence. The
# values come as a JSON array of objects (psycopg dumps one string, not an
# array per column), and the rows are locked in the order a push locks them
# (`created_at`, `id`), so the two never wait for each other in opposite
# orders.
_RECORD_CHECKS: Statement = Statement(
    "signal_record_checks",
    """
            WITH t AS (
                SELECT * FROM jsonb_to_recordset(CAST(:writes AS jsonb))
                    AS t(id text, fence bigint, inc int, errors int, next_at timestamptz,
                         next_reason text, c_reason text, c_outcome text, c_error text,
                         c_counted boolean, c_seen int)
            ), locked AS (
                SELECT s.id FROM signals s JOIN t ON t.id = s.id
                 WHERE s.check_fence = t.fence AND s.status = 'waiting'
                 ORDER BY s.created_at, s.id
                 FOR UPDATE OF s
            ), upd AS (
                UPDATE signals s
                   SET checks_count = s.checks_count + t.inc,
                       consecutive_errors = t.errors,
                       last_check_at = now(),
                       -- A check that made no call (breaker open, provider
                       -- busy) is no look: expiry still waits for one.
                       last_look_at = CASE WHEN t.c_outcome = 'circuit_open' THEN s.last_look_at
                                           ELSE :c_started END,
                       last_outcome = t.c_outcome,
                       last_error_code = t.c_error,
                       next_check_at = CASE WHEN s.enqueued_at > :c_started THEN now()
                                            ELSE t.next_at END,
                       next_check_reason = CASE WHEN s.enqueued_at > :c_started THEN 'push'
                                                ELSE t.next_reason END,
                       check_lease_until = NULL,
                       updated_at = now()
                  FROM t, locked
                 WHERE s.id = t.id AND s.id = locked.id
                   AND s.check_fence = t.fence AND s.status = 'waiting'
                RETURNING s.id, s.generation, s.provider, t.fence, t.c_reason, t.c_outcome,
                          t.c_error, t.c_counted, t.c_seen,
                          coalesce(s.enqueued_at > :c_started, false) AS pushed
            ), chk AS (
                INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,
                                    error_code, batch_id, started_at, counted, messages_seen)
                SELECT upd.id, upd.generation, upd.fence, upd.provider, upd.c_reason,
                       upd.c_outcome, upd.c_error, :c_batch, :c_started, upd.c_counted,
                       upd.c_seen
                  FROM upd
                ON CONFLICT (signal_id, fence) DO NOTHING
            )
            SELECT id, pushed FROM upd
    """,
)


def signal_record_check(
    session: Connection,
    signal_id: str,
    fence: int,
    check: CheckRecord,
    *,
    consecutive_errors: int,
    next_check_at: datetime | None,
    next_check_reason: str,
) -> tuple[bool, bool]:
    """Write a check that found nothing (its row and its effect on the
    signal) in one statement, guarded by the fence.

    Returns (written, pushed): `pushed` says a push arrived while the check
    ran (it stamped `enqueued_at` after the check began); the push is kept
    (due now, reason `push`) instead of being overwritten by the backoff,
    and the caller must send the task again.
    """
    write = CheckWrite(
        signal_id, fence, check, consecutive_errors, next_check_at, next_check_reason
    )
    written = signal_record_checks(session, [write])
    return (signal_id in written, written.get(signal_id, False))


@dataclass(frozen=True)
class CheckWrite:
    """One signal's no-match write of a look (`signal_record_checks`)."""

    signal_id: str
    fence: int
    check: CheckRecord
    consecutive_errors: int
    next_check_at: datetime | None
    next_check_reason: str


def signal_record_checks(session: Connection, writes: Sequence[CheckWrite]) -> dict[str, bool]:
    """`signal_record_check` for several signals in one statement: each
    written only if its fence still holds. The checks of one look share
    their start and batch id (the first write's are used for all).

    Returns signal id → pushed, for each signal written."""
    if not writes:
        return {}
    first_check = writes[0].check
    if any(
        w.check.started_at != first_check.started_at or w.check.batch_id != first_check.batch_id
        for w in writes
    ):
        raise ValueError("the checks written together must share their start and batch id")
    payload = json.dumps(
        [
            {
                "id": w.signal_id,
                "fence": w.fence,
                "inc": 1 if w.check.counted else 0,
                "errors": w.consecutive_errors,
                "next_at": None if w.next_check_at is None else w.next_check_at.isoformat(),
                "next_reason": w.next_check_reason,
                "c_reason": w.check.reason,
                "c_outcome": w.check.outcome,
                "c_error": w.check.error_code,
                "c_counted": w.check.counted,
                "c_seen": w.check.messages_seen,
            }
            for w in writes
        ]
    )
    rows = runner.all(
        session,
        _RECORD_CHECKS,
        {"writes": payload, "c_started": first_check.started_at, "c_batch": first_check.batch_id},
    )
    return {r["id"]: bool(r["pushed"]) for r in rows}


def _last_look(name: str, *, sets: str, outcome: str) -> Statement:
    """A look that ends the wait: the signal moves `:src` → `:dst` if its
    fence holds, its check fields are closed, `sets` are what else the look
    records and `outcome` its last outcome; with the check's row, in one
    statement. `n` is 1 when the signal was written."""
    return Statement(
        name,
        f"""
            WITH upd AS (
                UPDATE signals
                   SET status = :dst, {sets}
                       checks_count = checks_count + :inc, consecutive_errors = 0,
                       last_check_at = now(), last_look_at = :c_started,
                       last_outcome = {outcome}, last_error_code = NULL, next_check_at = NULL,
                       check_lease_until = NULL, updated_at = now()
                 WHERE id = :id AND check_fence = :fence AND status = :src
                RETURNING id, generation, provider
            )"""
        + _CHECK_ROW
        + "SELECT count(*) AS n FROM upd",
    )


_MARK_FOUND: Statement = _last_look(
    "signal_mark_found", sets="message_id = :mid, found_at = now(),", outcome="'matched'"
)


def signal_mark_found(
    session: Connection,
    signal_id: str,
    fence: int,
    message_id: str,
    check: CheckRecord,
    *,
    move: Transition = FIND,
) -> bool:
    """waiting → found with `message_id`, and the matched check's row, in one
    statement guarded by the fence. The unique index on (namespace,
    message_id) raises IntegrityError if another signal of the namespace
    took the message first. `move` ARRIVAL makes it `arrived` instead (an
    `expect: none` signal; the index leaves arrived signals out: nothing is
    taken)."""
    row = runner.one(
        session,
        _MARK_FOUND,
        {
            **check.params(),
            **move.params,
            "id": signal_id,
            "fence": fence,
            "mid": message_id,
            "inc": 1 if check.counted else 0,
        },
    )
    return row is not None and int(row["n"]) == 1


_MARK_ABSENT: Statement = _last_look("signal_mark_absent", sets="", outcome=":c_outcome")


def signal_mark_absent(session: Connection, signal_id: str, fence: int, check: CheckRecord) -> bool:
    """waiting → absent (`expect: none`: its final look found no matching
    message), and that check's row, in one statement guarded by the fence."""
    row = runner.one(
        session,
        _MARK_ABSENT,
        {
            **check.params(),
            **ABSENCE.params,
            "id": signal_id,
            "fence": fence,
            "inc": 1 if check.counted else 0,
        },
    )
    return row is not None and int(row["n"]) == 1


def check_counts_by_outcome(
    session: Connection, signal_ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    rows = runner.all(session, _COUNTS_BY_OUTCOME, {"ids": list(signal_ids)})
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["signal_id"], {})[r["outcome"]] = int(r["count"])
    return out


_COUNTS_BY_OUTCOME: Statement = Statement(
    "check_counts_by_outcome",
    "SELECT signal_id, outcome, count(*) FROM checks WHERE signal_id = ANY(:ids)"
    " GROUP BY signal_id, outcome",
)


_BY_START = Keyset("started_at, id")


def check_list(
    session: Connection, signal_id: str, *, after: tuple[datetime, int] | None, limit: int
) -> list[CheckRow]:
    """One page of a signal's checks, oldest first (every generation:
    redrives keep history), after the cursor `after`."""
    params: dict[str, Any] = {"sid": signal_id}
    sql = (
        "SELECT id, signal_id, generation, reason, outcome, error_code, started_at,"
        " finished_at, messages_seen FROM checks WHERE signal_id = :sid AND "
        + _BY_START.after(after, params)
        + _BY_START.page(limit, params)
    )
    stmt: Statement[CheckRow] = runner.variant("check_list", sql)
    return runner.all(session, stmt, params)
