"""Repository of checks (`checks`) and the check protocol's writes to `signals`.

A check takes its signals with `FOR UPDATE SKIP LOCKED`, stamps a lease and
a new fence (`signal_lock_for_check`), commits, calls the provider with no
lock held, then writes its result guarded by the fence: the signal's update
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

from sqlalchemy import Connection, text

from app.db import raw
from app.db.pagination import Keyset
from app.db.rows import Row, affected, every
from app.domain.states import ABSENCE, FIND, Transition

_LOCK_FOR_CHECK = raw.Query(
    """
                WITH target AS (
                    SELECT provider FROM signals WHERE id = :id
                ), clock AS (
                    -- The look begins now, not at BEGIN: a create (or push)
                    -- committed between the two is taken here and is not
                    -- "pushed while its check ran", which would look again.
                    SELECT clock_timestamp() AS looked_at
                ), due AS (
                    SELECT s.id FROM signals s, target t
                    WHERE s.status = 'waiting'
                      AND s.provider = t.provider
                      AND s.next_check_at <= now() + make_interval(secs => :window)
                      AND (s.check_lease_until IS NULL OR s.check_lease_until < now())
                    ORDER BY (s.id = :id) DESC, s.next_check_at
                    LIMIT :limit
                    FOR UPDATE OF s SKIP LOCKED
                )
                UPDATE signals s
                   SET check_fence = s.check_fence + 1,
                       check_lease_until = now() + make_interval(secs => :lease),
                       updated_at = now()
                  FROM due, clock WHERE s.id = due.id
                RETURNING s.*, clock.looked_at
"""
)


def signal_lock_for_check(
    session: Connection,
    signal_id: str,
    *,
    lease_seconds: float,
    batch_limit: int,
    coalesce_seconds: float = 0.0,
) -> list[Row]:
    """Take `signal_id` and the other due signals of its provider for one check.

    Signals due within `coalesce_seconds` ride along: one provider call then
    answers them all instead of one call each a moment apart. Rows already
    locked or under another check's lease are skipped. Each taken row gets a
    new fence and a lease; the caller commits at once and calls the provider
    with no lock held. Each row carries `looked_at`, the server's now.
    """
    return raw.rows(
        session,
        _LOCK_FOR_CHECK,
        {"id": signal_id, "lease": lease_seconds, "limit": batch_limit, "window": coalesce_seconds},
    )


# A new sink signal's first look when the sink holds no mail it could see:
# the lock, the sink's search and the no-match write of `signal_lock_for_check`,
# the sink provider and `signal_record_check`, in one statement. The row is
# taken only as its create left it (no check took it, no push made it due
# again: a push committed after this statement's snapshot changes
# `next_check_reason`, and the lock re-reads the row, so it is then not
# taken) and before its deadline (a final look decides an expiry, which this
# statement does not write). Any sink message to the recipient from the
# near-miss lookback before its window on, in the window or before it, and
# nothing is written: the caller makes the whole look instead.
_FIRST_LOOK_EMPTY = raw.Query(
    """
                WITH clock AS (
                    SELECT clock_timestamp() AS looked_at
                ), taken AS (
                    SELECT s.id, s.recipient, s.received_after
                      FROM signals s, clock
                     WHERE s.id = :id AND s.status = 'waiting'
                       AND s.check_fence = :fence AND s.next_check_reason = 'first'
                       AND s.next_check_at <= clock.looked_at
                       AND clock.looked_at < s.expires_at
                       AND (s.check_lease_until IS NULL OR s.check_lease_until < now())
                       FOR UPDATE OF s SKIP LOCKED
                ), mail AS (
                    -- The recipient's messages from the GIN index, the time
                    -- bound applied to them: `OFFSET 0` keeps the LIMIT out of
                    -- that scan. Without it the planner, expecting a match
                    -- among many rows, read the whole table in order to stop
                    -- at the first: every stored message for each new signal,
                    -- 119 ms at 100,000 (EXPLAIN ANALYZE).
                    SELECT 1
                      FROM taken t,
                           LATERAL (SELECT received_at FROM sink_messages
                                     WHERE all_recipients && ARRAY[lower(t.recipient)]::text[]
                                    OFFSET 0) sm
                     WHERE sm.received_at >= t.received_after - make_interval(secs => :lookback)
                     LIMIT 1
                ), upd AS (
                    UPDATE signals s
                       SET check_fence = s.check_fence + 1,
                           checks_count = s.checks_count + :inc,
                           consecutive_errors = 0,
                           last_check_at = clock_timestamp(),  -- written after the look began
                           last_look_at = clock.looked_at,
                           last_outcome = 'no_match',
                           last_error_code = NULL,
                           next_check_at = :next_at,
                           next_check_reason = :next_reason,
                           check_lease_until = NULL,
                           updated_at = now()
                      FROM taken, clock
                     WHERE s.id = taken.id AND NOT EXISTS (SELECT 1 FROM mail)
                    RETURNING s.id, s.generation, s.provider, s.check_fence
                ), chk AS (
                    INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,
                                        error_code, batch_id, started_at, finished_at, counted,
                                        messages_seen)
                    SELECT upd.id, upd.generation, upd.check_fence, upd.provider, 'first',
                           'no_match', NULL, :batch, clock.looked_at, clock_timestamp(), :counted, 0
                      FROM upd, clock
                    ON CONFLICT (signal_id, fence) DO NOTHING
                )
                SELECT count(*) AS n FROM upd
"""
)


def signal_first_look_if_empty(
    session: Connection,
    signal_id: str,
    *,
    fence: int,
    lookback_seconds: float,
    counted: bool,
    next_check_at: datetime | None,
    next_check_reason: str,
    batch_id: str,
) -> bool:
    """The first look of a new sink signal, made and written in one statement
    when the sink holds no message to its recipient from `lookback_seconds`
    before its window on (see `_FIRST_LOOK_EMPTY`): its check row (reason
    `first`, outcome `no_match`, none seen) and the signal's next check, as
    the whole look would write them. False when nothing was written: the
    signal was not as its create left it, or the sink holds mail for it."""
    row = raw.row(
        session,
        _FIRST_LOOK_EMPTY,
        {
            "id": signal_id,
            "fence": fence,
            "lookback": lookback_seconds,
            "inc": 1 if counted else 0,
            "counted": counted,
            "next_at": next_check_at,
            "next_reason": next_check_reason,
            "batch": batch_id,
        },
    )
    return row is not None and int(row["n"]) == 1


def signal_extend_check_leases(
    session: Connection, fences: Sequence[tuple[str, int]], lease_seconds: float
) -> int:
    """Heartbeat: push the check lease of each (signal, fence) still held."""
    if not fences:
        return 0
    return affected(
        session.execute(
            text(
                """
                UPDATE signals s
                   SET check_lease_until = now() + make_interval(secs => :lease)
                  FROM unnest(CAST(:ids AS text[]), CAST(:fences AS bigint[])) AS f(id, fence)
                 WHERE s.id = f.id AND s.check_fence = f.fence AND s.status = 'waiting'
                """
            ),
            {
                "ids": [i for i, _ in fences],
                "fences": [f for _, f in fences],
                "lease": lease_seconds,
            },
        )
    )


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
_RECORD_CHECKS = raw.Query(
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
    """
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
    rows = raw.rows(
        session,
        _RECORD_CHECKS,
        {"writes": payload, "c_started": first_check.started_at, "c_batch": first_check.batch_id},
    )
    return {r["id"]: bool(r["pushed"]) for r in rows}


_MARK_FOUND = raw.Query(
    """
            WITH upd AS (
                UPDATE signals
                   SET status = :dst, message_id = :mid, found_at = now(),
                       checks_count = checks_count + :inc, consecutive_errors = 0,
                       last_check_at = now(), last_look_at = :c_started,
                       last_outcome = 'matched', last_error_code = NULL, next_check_at = NULL,
                       check_lease_until = NULL, updated_at = now()
                 WHERE id = :id AND check_fence = :fence AND status = :src
                RETURNING id, generation, provider
            )"""
    + _CHECK_ROW
    + "SELECT count(*) AS n FROM upd"
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
    row = raw.row(
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


_MARK_ABSENT = raw.Query(
    """
            WITH upd AS (
                UPDATE signals
                   SET status = :dst, checks_count = checks_count + :inc, consecutive_errors = 0,
                       last_check_at = now(), last_look_at = :c_started,
                       last_outcome = :c_outcome, last_error_code = NULL, next_check_at = NULL,
                       check_lease_until = NULL, updated_at = now()
                 WHERE id = :id AND check_fence = :fence AND status = :src
                RETURNING id, generation, provider
            )"""
    + _CHECK_ROW
    + "SELECT count(*) AS n FROM upd"
)


def signal_mark_absent(session: Connection, signal_id: str, fence: int, check: CheckRecord) -> bool:
    """waiting → absent (`expect: none`: its final look found no matching
    message), and that check's row, in one statement guarded by the fence."""
    row = raw.row(
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
    rows = session.execute(
        text(
            "SELECT signal_id, outcome, count(*) FROM checks WHERE signal_id = ANY(:ids)"
            " GROUP BY signal_id, outcome"
        ),
        {"ids": list(signal_ids)},
    ).all()
    out: dict[str, dict[str, int]] = {}
    for sid, outcome, n in rows:
        out.setdefault(sid, {})[outcome] = int(n)
    return out


_BY_START = Keyset("started_at, id")


def check_list(
    session: Connection, signal_id: str, *, after: tuple[datetime, int] | None, limit: int
) -> Sequence[Row]:
    """One page of a signal's checks, oldest first (every generation:
    redrives keep history), after the cursor `after`."""
    params: dict[str, Any] = {"sid": signal_id}
    return every(
        session,
        "SELECT id, signal_id, generation, reason, outcome, error_code, started_at,"
        " finished_at, messages_seen FROM checks WHERE signal_id = :sid AND "
        + _BY_START.after(after, params)
        + _BY_START.page(limit, params),
        params,
    )
