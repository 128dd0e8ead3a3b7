"""How a check takes its signals: with `FOR UPDATE SKIP LOCKED`, a lease and
a new fence, committed at once (`signal_lock_for_check`; with a push in the
same round trip, `signal_push_and_lock`), and the lease's heartbeat. Also
the new sink signal's first look in one statement. The check's writes are in
`app/db/checks.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import due as due_db
from app.db import runner
from app.db.runner import Statement

# The end of each take: lock the first `:limit` due rows, skipping those
# another take holds, and stamp each with a lease and a new fence.
_LEASE_DUE = """                    LIMIT :limit
                    FOR UPDATE OF s SKIP LOCKED
                )
                UPDATE signals s
                   SET check_fence = s.check_fence + 1,
                       check_lease_until = now() + make_interval(secs => :lease),
                       updated_at = now()
                  FROM due, clock WHERE s.id = due.id
                RETURNING s.*, clock.looked_at
"""

_LOCK_FOR_CHECK: Statement = Statement(
    "signal_lock_for_check",
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
"""
    + _LEASE_DUE,
)


# `_LOCK_FOR_CHECK` after a push in the same transaction (`signal_push_and_lock`):
# the provider is given, the pushed recipients' signals come first, and "due"
# is measured from this statement's clock, since `now()` is the transaction's
# start, before the push stamped its signals due. A push that made nothing
# due takes nothing (`pushed`: a signal this transaction pushed, stamped at or
# after its start), as no look followed such a push before: mail nobody waits
# for costs one index probe here, not a lock over the provider's due signals.
_LOCK_PUSHED: Statement = Statement(
    "signal_lock_pushed",
    """
                WITH clock AS (
                    SELECT clock_timestamp() AS looked_at
                ), pushed AS (
                    SELECT 1 FROM signals
                     WHERE status = 'waiting' AND provider = :provider
                       AND recipient = ANY(:rcpts) AND next_check_reason = 'push'
                       AND enqueued_at >= now()
                     LIMIT 1
                ), due AS (
                    SELECT s.id FROM signals s, clock
                    WHERE EXISTS (SELECT 1 FROM pushed)
                      AND s.status = 'waiting'
                      AND s.provider = :provider
                      AND s.next_check_at <= clock.looked_at + make_interval(secs => :window)
                      AND (s.check_lease_until IS NULL OR s.check_lease_until < now())
                    ORDER BY (s.recipient = ANY(:rcpts)) DESC, s.next_check_at
"""
    + _LEASE_DUE,
)


def signal_push_and_lock(
    session: Connection,
    provider: str,
    recipients: Sequence[str],
    *,
    limit: int,
    lease_seconds: float,
    batch_limit: int,
    coalesce_seconds: float = 0.0,
) -> tuple[list[tuple[str, datetime]], list[dict[str, Any]]]:
    """A push (`due.signal_push_due` for `recipients`, its first `limit`) and
    the lock of `signal_lock_for_check` that takes what it made due, sent
    together: one round trip and, on an autocommit connection, one commit.

    Returns (the pushed signals' (id, created_at), the taken rows): the
    pushed first, then the provider's other due signals, up to
    `batch_limit`; a pushed signal under another check's lease is not taken
    (that check sees the push as newer than its look, and looks again). An
    error undoes both: no signal is left leased without its look."""
    push, push_params = due_db.push_due_statement(provider, recipients, limit=limit)
    pushed, taken = runner.together(
        session,
        [
            (push, push_params),
            (
                _LOCK_PUSHED,
                {
                    "provider": provider,
                    "rcpts": push_params["rcpts"],
                    "lease": lease_seconds,
                    "limit": batch_limit,
                    "window": coalesce_seconds,
                },
            ),
        ],
    )
    return due_db.pushed_of(pushed), taken


def signal_lock_for_check(
    session: Connection,
    signal_id: str,
    *,
    lease_seconds: float,
    batch_limit: int,
    coalesce_seconds: float = 0.0,
) -> list[dict[str, Any]]:
    """Take `signal_id` and the other due signals of its provider for one check.

    Signals due within `coalesce_seconds` ride along: one provider call then
    answers them all instead of one call each a moment apart. Rows already
    locked or under another check's lease are skipped. Each taken row gets a
    new fence and a lease; the caller commits at once and calls the provider
    with no lock held. Each row carries `looked_at`, the server's now.
    """
    return runner.all(
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
#
# Its commit does not wait for the WAL flush (`synchronous_commit` off for
# this statement's transaction alone, `set_config(..., true)` in `clock`,
# which every write reads). What it writes is a look that found nothing, made
# again if lost: a server crash before the flush leaves the signal as its
# create committed it (the create's commit waited for its flush), due with
# its first look owed, which the sweep makes. Anything made durable after it
# (a push's commit, the found write) flushes the WAL up to and past it, so
# no later fact outlives it. The create's answer does not wait for a flush
# twice: one WAL flush of PostgreSQL's CPU and latency less per create.
_FIRST_LOOK_EMPTY: Statement = Statement(
    "signal_first_look_if_empty",
    """
                WITH clock AS (
                    SELECT clock_timestamp() AS looked_at,
                           set_config('synchronous_commit', 'off', true) AS flush
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
""",
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
    row = runner.one(
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


# After a create that made its first look in its own statement: mail stored
# after that statement's snapshot, and pushed before its commit, found no
# signal to push. Read once the create committed, such mail makes the signal
# due now, as its push would have; none (the usual case) writes nothing.
_DUE_IF_MAIL: Statement = Statement(
    "signal_due_if_mail",
    """
                UPDATE signals s
                   SET next_check_at = clock_timestamp(), next_check_reason = 'push',
                       enqueued_at = clock_timestamp()
                 WHERE s.id = :id AND s.status = 'waiting' AND s.check_fence = :fence
                   AND s.next_check_reason <> 'push'
                   AND EXISTS (
                       SELECT 1
                         FROM (SELECT received_at FROM sink_messages
                                WHERE all_recipients && ARRAY[CAST(:address AS text)]::text[]
                               OFFSET 0) sm
                        WHERE sm.received_at >= s.received_after - make_interval(secs => :lookback))
                RETURNING s.id
""",
)


def signal_due_if_mail(
    session: Connection, signal_id: str, recipient: str, *, fence: int, lookback_seconds: float
) -> bool:
    """Make `signal_id` due now (reason `push`) when the sink holds mail to
    `recipient` (its recipient) from `lookback_seconds` before its window on
    and the signal is still as its first look left it (`fence`); True when
    it did. The address is a parameter, not the row's column: the planner
    then reads it from the index (from the column it read every message)."""
    row = runner.one(
        session,
        _DUE_IF_MAIL,
        {
            "id": signal_id,
            "address": recipient.strip().lower(),
            "fence": fence,
            "lookback": lookback_seconds,
        },
    )
    return row is not None


# The heartbeat: each (signal, fence) still held gets a new lease.
_EXTEND_CHECK_LEASES: Statement = Statement(
    "signal_extend_check_leases",
    """
                UPDATE signals s
                   SET check_lease_until = now() + make_interval(secs => :lease)
                  FROM unnest(CAST(:ids AS text[]), CAST(:fences AS bigint[])) AS f(id, fence)
                 WHERE s.id = f.id AND s.check_fence = f.fence AND s.status = 'waiting'
                """,
)


def signal_extend_check_leases(
    session: Connection, fences: Sequence[tuple[str, int]], lease_seconds: float
) -> int:
    """Heartbeat: push the check lease of each (signal, fence) still held."""
    if not fences:
        return 0
    return runner.exec(
        session,
        _EXTEND_CHECK_LEASES,
        {
            "ids": [i for i, _ in fences],
            "fences": [f for _, f in fences],
            "lease": lease_seconds,
        },
    )
