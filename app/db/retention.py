"""Retention: the SQL that deletes old data in small batches.

Every function deletes (or purges) at most `limit` rows and returns how many
it touched; the caller loops, one short transaction per batch, so retention
never holds locks for long nor builds one huge transaction. Rows another
transaction holds are skipped (`SKIP LOCKED`) and taken at the next run.

What is never touched here: anything of a signal that is still in play
(`waiting`, `found`, `claimed`): its checks, its message, the near misses it
may report, the sink messages to its recipient.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.db import runner
from app.db.runner import Statement

# The statuses whose data retention leaves alone.
_IN_PLAY = "('waiting', 'found', 'claimed')"


def _count(session: Connection, stmt: Statement, *, older_than_hours: float, limit: int) -> int:
    """Run one batch's statement (`:secs` the cutoff's age, `:limit` the batch)."""
    return runner.exec(session, stmt, {"secs": older_than_hours * 3600, "limit": limit})


def _delete_oldest(name: str, table: str, age: str, where: str | None = None) -> Statement:
    """A batch delete: the oldest (by the column `age`) `:limit` rows of
    `table` whose `age` lies before the cutoff and that `where`, if given,
    also picks (naming `table` by its initials), skipping those another
    transaction holds."""
    alias = "".join(word[0] for word in table.split("_"))
    also = "" if where is None else f"\n               AND {where}"
    return Statement(
        name,
        f"""
        DELETE FROM {table} WHERE id IN (
            SELECT {alias}.id FROM {table} {alias}
             WHERE {alias}.{age} < now() - make_interval(secs => :secs){also}
             ORDER BY {alias}.{age}
             LIMIT :limit
             FOR UPDATE SKIP LOCKED)
    """,
    )


def _to_a_waiting_recipient(addresses: str) -> str:
    """Whether one of `addresses` (an SQL array of lower-cased addresses) is
    a waiting signal's recipient. The waiting recipients are read and hashed
    once per statement: a sublink that is not a condition of its own (here
    under `IS TRUE`) stays a subplan, hashed, instead of becoming a join. As
    a join (`lower(s.recipient) = ANY(...)`), every old row was compared with
    every waiting signal: 20,000 waiting signals and 2,000 old sink messages
    took 20 s a batch, and at 100,000 a batch outlived the statement timeout,
    so nothing old was ever deleted."""
    return f"""EXISTS (
                    SELECT 1 FROM unnest({addresses}) AS r(a)
                     WHERE (r.a IN (SELECT lower(s.recipient) FROM signals s
                                     WHERE s.status = 'waiting')) IS TRUE)"""


_SINK_MESSAGES_OLD = _delete_oldest(
    "sink_message_delete_old",
    "sink_messages",
    "received_at",
    f"""NOT {_to_a_waiting_recipient("sm.all_recipients")}
               AND NOT EXISTS (
                    SELECT 1 FROM messages m JOIN signals s ON s.message_id = m.id
                     WHERE m.provider_message_id = sm.id::text AND s.status IN {_IN_PLAY})""",
)


# The waiting recipients' hash must fit in work_mem (times
# hash_mem_multiplier), or PostgreSQL plans the comparison per row again:
# 4 MB (x 2) holds about 100,000 addresses. This room, for the batch's
# transaction only, holds about two million.
_WAITING_HASH_WORK_MEM = "64MB"


_ROOM_FOR_THE_WAITING = Statement(
    "retention_room_for_the_waiting", f"SET LOCAL work_mem = '{_WAITING_HASH_WORK_MEM}'"
)


def _room_for_the_waiting(session: Connection) -> None:
    runner.exec(session, _ROOM_FOR_THE_WAITING)


def sink_message_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete sink messages received before the cutoff, except those addressed
    to a waiting signal's recipient or recorded as an in-play signal's message."""
    _room_for_the_waiting(session)
    return _count(session, _SINK_MESSAGES_OLD, older_than_hours=older_than_hours, limit=limit)


_MESSAGES_OLD = _delete_oldest(
    "message_delete_old",
    "messages",
    "observed_at",
    f"""NOT EXISTS (SELECT 1 FROM signals s WHERE s.message_id = m.id)
               AND NOT EXISTS (
                    SELECT 1 FROM near_misses n JOIN signals s ON s.id = n.signal_id
                     WHERE n.message_id = m.id AND s.status = 'waiting')
               AND NOT {_to_a_waiting_recipient("m.recipients")}""",
)


def message_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete observed messages older than the cutoff that no signal points
    at, that are no waiting signal's near miss, and that are not addressed to
    a waiting signal's recipient (it could still match them)."""
    _room_for_the_waiting(session)
    return _count(session, _MESSAGES_OLD, older_than_hours=older_than_hours, limit=limit)


_CONSUMED_RAW_OLD = Statement(
    "message_purge_consumed_raw",
    f"""
        UPDATE messages SET raw = NULL WHERE id IN (
            SELECT m.id FROM messages m JOIN signals s ON s.message_id = m.id
             WHERE m.raw IS NOT NULL AND s.status = 'consumed'
               AND s.updated_at < now() - make_interval(secs => :secs)
               AND NOT EXISTS (
                    SELECT 1 FROM signals o WHERE o.message_id = m.id AND o.status IN {_IN_PLAY})
               AND NOT {_to_a_waiting_recipient("m.recipients")}
             LIMIT :limit
             FOR UPDATE OF m SKIP LOCKED)
        """,
)


def message_purge_consumed_raw(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Drop the body of messages whose signal was consumed before the cutoff,
    unless another signal (of any namespace) still in play points at it or a
    waiting signal's recipient could still match it.

    The row (subject, received_at, run marker) stays as the evidence the
    receipt and the signal view point at, until the signal itself ages out.
    """
    _room_for_the_waiting(session)
    return _count(session, _CONSUMED_RAW_OLD, older_than_hours=older_than_hours, limit=limit)


_CHECKS_OLD = Statement(
    "check_delete_old",
    f"""
            WITH gone AS (
                DELETE FROM checks WHERE id IN (
                    SELECT c.id FROM checks c JOIN signals s ON s.id = c.signal_id
                     WHERE c.finished_at < now() - make_interval(secs => :secs)
                       AND s.status NOT IN {_IN_PLAY}
                     ORDER BY c.finished_at
                     LIMIT :limit
                     FOR UPDATE OF c SKIP LOCKED)
                RETURNING signal_id, outcome
            ), tally AS (
                SELECT signal_id, outcome, count(*) AS n FROM gone GROUP BY 1, 2
            ), folded AS (
                UPDATE signals s
                   SET checks_archived = (
                       SELECT jsonb_object_agg(k, v) FROM (
                           SELECT k, sum(v) AS v FROM (
                               SELECT key AS k, value::bigint AS v
                                 FROM jsonb_each_text(s.checks_archived)
                               UNION ALL
                               SELECT t.outcome, t.n FROM tally t WHERE t.signal_id = s.id
                           ) parts GROUP BY k
                       ) merged)
                 WHERE s.id IN (SELECT signal_id FROM tally)
                RETURNING 1
            )
            SELECT count(*) FROM gone
            """,
)


def check_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete checks finished before the cutoff whose signal is no longer in play.

    Their counts by outcome are folded into `signals.checks_archived` in the
    same statement, so the run's evidence keeps them; the dead letter keeps
    its own copy and the signal its `checks_count`.
    """
    row = runner.one(session, _CHECKS_OLD, {"secs": older_than_hours * 3600, "limit": limit})
    assert row is not None
    return int(row["count"])


_RECEIPTS_OLD = _delete_oldest("receipt_delete_old", "receipts", "consumed_at")


def receipt_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    return _count(session, _RECEIPTS_OLD, older_than_hours=older_than_hours, limit=limit)


_REFUSALS_OLD = _delete_oldest("smtp_refusal_delete_old", "smtp_refusals", "refused_at")


def smtp_refusal_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete the sink's refused deliveries older than the cutoff (kept as
    long as the mail they explain)."""
    return _count(session, _REFUSALS_OLD, older_than_hours=older_than_hours, limit=limit)


_DEAD_LETTERS_OLD = _delete_oldest(
    "dead_letter_delete_old", "dead_letters", "created_at", "dl.state <> 'open'"
)


def dead_letter_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete resolved (redriven or discarded) dead letters older than the
    cutoff; open ones stay until an operator resolves them."""
    return _count(session, _DEAD_LETTERS_OLD, older_than_hours=older_than_hours, limit=limit)


_SIGNALS_OLD = _delete_oldest(
    "signal_delete_old",
    "signals",
    "updated_at",
    """s.status IN ('consumed', 'expired', 'absent', 'arrived', 'cancelled')
               AND NOT EXISTS (
                    SELECT 1 FROM dead_letters d WHERE d.signal_id = s.id AND d.state = 'open')""",
)


def signal_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete terminal signals (consumed, absent, arrived, cancelled, or expired
    with no open dead letter) last changed before the cutoff; their checks, near misses, claims and
    idempotency keys go with them (foreign keys cascade)."""
    return _count(session, _SIGNALS_OLD, older_than_hours=older_than_hours, limit=limit)


_FOUND_SIGNALS_OLD = _delete_oldest(
    "signal_delete_unclaimed_found", "signals", "updated_at", "s.status = 'found'"
)


def signal_delete_unclaimed_found(
    session: Connection, *, older_than_hours: float, limit: int
) -> int:
    """Delete `found` signals nobody claimed since before the cutoff: a found
    signal is not eternal. What cascades from them goes with them, and their
    message, no longer pointed at, ages out with the content."""
    return _count(session, _FOUND_SIGNALS_OLD, older_than_hours=older_than_hours, limit=limit)


_HOLDS_OLD = _delete_oldest(
    "hold_delete_old",
    "address_holds",
    "held_from",
    """(ah.released_at < now() - make_interval(secs => :secs)
                    OR (ah.released_at IS NULL AND NOT EXISTS (
                         SELECT 1 FROM signals s
                          WHERE s.recipient = ah.address AND s.namespace = ah.namespace)))""",
)


def hold_delete_old(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Delete address holds released before the cutoff, and open ones taken
    before it whose namespace has no signal left on the address (retention
    deleted them): the mail they covered is older than every horizon by then."""
    return _count(session, _HOLDS_OLD, older_than_hours=older_than_hours, limit=limit)
