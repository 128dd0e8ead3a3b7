"""Repository of due work: what the sweep finds due or lost, and a push.

An outbox row (a signal due a check, a webhook delivery due an attempt) needs
a task when it is due, nobody holds its lease, and no task was sent since it
became due, or the one sent is presumed lost: `due_or_lost` is that one
selection, for `signals` here and `webhook_deliveries` in `webhooks`. Also
here: the signals past their deadline, a push making signals due now, and
how late the oldest due check is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.pagination import BY_CREATION
from app.db.records import IdRow
from app.db.runner import Statement
from app.domain.states import ABSENCE


def due_or_lost(*, table: str, live: str, due_at: str, lease_until: str, lost_after: str) -> str:
    """The `due` CTE of an outbox's sweep: up to `:limit` ids of `table`'s rows
    that are `live` (an SQL condition), due (`due_at` passed), not under a
    live lease (`lease_until`), and whose `enqueued_at` is NULL, older than
    `due_at` (no task since they became due), or older than `lost_after`
    seconds (an SQL expression): the task sent was lost. Oldest due first,
    locked, skipping rows another sweep holds."""
    return f"""
            WITH due AS (
                SELECT id FROM {table}
                 WHERE {live} AND {due_at} <= now()
                   AND ({lease_until} IS NULL OR {lease_until} < now())
                   AND (enqueued_at IS NULL OR enqueued_at < {due_at}
                        OR enqueued_at < now() - make_interval(secs => {lost_after}))
                 ORDER BY {due_at}
                 LIMIT :limit
                 FOR UPDATE SKIP LOCKED
            )"""


# How many graces a signal whose final look never began waits (no worker took
# its task: a saturated pool, workers down) before it expires unseen.
UNLOOKED_GRACES = 4

# How many graces a sink signal whose final look never began waits when the
# sink holds mail to its address in its window: a look is owed that may find
# it, and expiring unseen would lose it. Bounded, so a deadline always ends.
HELD_MAIL_GRACES = 4 * UNLOOKED_GRACES


def signal_ids_past_deadline(
    session: Connection, limit: int, grace_seconds: float, sink_providers: Sequence[str] = ()
) -> list[str]:
    """Waiting signals past their deadline, not under a live check lease, that
    can expire now: their final look saw the provider (a check began at or
    after the deadline and found nothing); or their final looks failed for
    `grace_seconds` after the deadline (the provider kept failing); or no
    final look began in UNLOOKED_GRACES graces (no worker took it).

    A signal whose final look has not begun yet is not given up after one
    grace: mail held before the deadline must not be lost because every
    worker was busy with a slow provider. A signal of `sink_providers`
    (those whose mail is in `sink_messages`) whose final look never began
    is not given up at all while the sink holds mail to its address in its
    window (a backlog of final looks under overload), up to
    HELD_MAIL_GRACES graces: that look is made once the backlog drains."""
    params = {
        "limit": limit,
        "grace": grace_seconds,
        "unlooked": grace_seconds * UNLOOKED_GRACES,
        "held": grace_seconds * HELD_MAIL_GRACES,
        "sinks": list(sink_providers),
    }
    return [r["id"] for r in runner.all(session, _PAST_DEADLINE, params)]


# The held-mail probe reads the candidate's address from the GIN index (the
# fence `OFFSET 0` keeps the planner from reading the window's messages by
# time instead: under overload the window holds thousands of others' mail),
# as the look it waits for would (`tests/integration/test_expiry_rule.py`).
_PAST_DEADLINE: Statement[IdRow] = Statement(
    "signal_ids_past_deadline",
    """
                SELECT s.id FROM signals s
                 WHERE s.status = 'waiting' AND s.expires_at <= now()
                   AND (s.last_look_at >= s.expires_at
                            AND (s.last_outcome = 'no_match'
                                 OR s.expires_at <= now() - make_interval(secs => :grace))
                        OR s.expires_at <= now() - make_interval(secs => :unlooked)
                            AND (s.provider <> ALL(CAST(:sinks AS text[]))
                                 OR s.expires_at <= now() - make_interval(secs => :held)
                                 OR NOT EXISTS (
                                     SELECT 1
                                       FROM (SELECT received_at FROM sink_messages
                                              WHERE all_recipients
                                                    && ARRAY[lower(btrim(s.recipient))]::text[]
                                             OFFSET 0) sm
                                      WHERE sm.received_at >= s.received_after - interval '1 second'
                                        AND sm.received_at <= s.expires_at + interval '1 second')))
                   AND (s.check_lease_until IS NULL OR s.check_lease_until < now())
                 ORDER BY s.expires_at
                 LIMIT :limit
                 FOR UPDATE OF s SKIP LOCKED
                """,
)


def signal_absent_past_deadline(session: Connection, limit: int) -> list[str]:
    """`expect: none` signals past their deadline whose final look (one that
    began at or after the deadline) saw the provider and found no matching
    message: waiting → absent. Their ids. (A check that decided so writes
    `absent` itself; this is the sweep's safety net for one that did not.)"""
    rows = runner.all(session, _ABSENT_PAST_DEADLINE, {"limit": limit, **ABSENCE.params})
    return [r["id"] for r in rows]


_ABSENT_PAST_DEADLINE: Statement[IdRow] = Statement(
    "signal_absent_past_deadline",
    """
                UPDATE signals SET status = :dst, next_check_at = NULL,
                       check_lease_until = NULL, updated_at = now()
                 WHERE id IN (
                    SELECT id FROM signals
                     WHERE status = 'waiting' AND expect = 'none' AND expires_at <= now()
                       AND last_look_at >= expires_at AND last_outcome = 'no_match'
                       AND (check_lease_until IS NULL OR check_lease_until < now())
                     ORDER BY expires_at
                     LIMIT :limit
                     FOR UPDATE SKIP LOCKED)
                   AND status = :src
                RETURNING id
                """,
)


_MARK_DUE_ENQUEUED: Statement = Statement(
    "signal_mark_due_enqueued",
    due_or_lost(
        table="signals",
        live="status = 'waiting'",
        due_at="next_check_at",
        lease_until="check_lease_until",
        lost_after="CASE WHEN provider = ANY(:looked_here) THEN :requeue_here ELSE :requeue END",
    )
    + """
            UPDATE signals s
               SET next_check_reason = CASE
                       WHEN s.enqueued_at IS NOT NULL AND s.enqueued_at >= s.next_check_at
                       THEN 'sweep' ELSE s.next_check_reason END,
                   enqueued_at = now()
              FROM due WHERE s.id = due.id
            RETURNING s.id, s.next_check_reason, s.provider
            """,
)


def signal_mark_due_enqueued(
    session: Connection,
    *,
    requeue_after_seconds: float,
    resend_lost: bool,
    limit: int,
    looked_here: Sequence[str] = (),
) -> list[tuple[str, str, str]]:
    """Stamp and return (id, reason, provider) of the due signals that need a
    task sent (or, for the providers in `looked_here`, a look made by the
    caller).

    A signal needs one when its next check is due (the final look at the
    deadline included) and no task was sent for it since. With `resend_lost`
    (the caller saw no task waiting in the queue), a task sent more than
    `requeue_after_seconds` ago that left the signal due was lost (broker
    restart, worker killed): it is re-sent with reason `sweep`. Without it
    only tasks older than ten times that are presumed lost, so a backlog is
    never fed with copies of what it already holds. A look the caller makes
    itself feeds no backlog: for `looked_here` providers a task or look older
    than `requeue_after_seconds` is always presumed lost.
    """
    rows = runner.all(
        session,
        _MARK_DUE_ENQUEUED,
        {
            "requeue": requeue_after_seconds * (1 if resend_lost else 10),
            "requeue_here": requeue_after_seconds,
            "looked_here": list(looked_here),
            "limit": limit,
        },
    )
    return [(r["id"], r["next_check_reason"], r["provider"]) for r in rows]


_PUSH_DUE_HEAD = """
                WITH pushed AS (
                    SELECT id FROM signals
                     WHERE status = 'waiting' AND provider = :provider"""
_PUSH_DUE_TAIL = """
                     ORDER BY created_at, id
                     LIMIT :limit
                     FOR UPDATE
                )
                UPDATE signals s
                   SET next_check_at = clock_timestamp(), next_check_reason = 'push',
                       -- clock_timestamp(): stamped after any check's lock is
                       -- released, so a check in flight sees the push as newer.
                       enqueued_at = clock_timestamp()
                  FROM pushed WHERE s.id = pushed.id
                RETURNING s.id, s.created_at
"""


def signal_push_due(
    session: Connection,
    provider: str,
    recipients: Iterable[str] | None,
    namespace: str | None = None,
    *,
    after: tuple[datetime, str] | None = None,
    limit: int = 500,
) -> list[tuple[str, datetime]]:
    """Make up to `limit` waiting signals of `provider` (optionally only those
    for `recipients`, or of one namespace), after `after` in (created_at, id)
    order, due now with reason `push`; return their (id, created_at)."""
    query, params = push_due_statement(provider, recipients, namespace, after=after, limit=limit)
    return pushed_of(runner.all(session, query, params))


def push_due_statement(
    provider: str,
    recipients: Iterable[str] | None,
    namespace: str | None = None,
    *,
    after: tuple[datetime, str] | None = None,
    limit: int = 500,
) -> tuple[Statement, dict[str, Any]]:
    """The statement of :func:`signal_push_due` and its parameters (its rows
    read by :func:`pushed_of`), for a caller that sends it with another."""
    params: dict[str, Any] = {"provider": provider, "ns": namespace, "limit": limit}
    where = " AND namespace = :ns" if namespace is not None else ""
    if after is not None:
        where += " AND " + BY_CREATION.after(after, params)
    if recipients is not None:
        params["rcpts"] = sorted({r.lower() for r in recipients})
        where += " AND recipient = ANY(:rcpts)"
    # Rows are locked in (created_at, id) order, the order a check's second
    # transaction locks them in: two multi-row lockers in one order cannot
    # deadlock each other.
    return runner.variant("signal_push_due", _PUSH_DUE_HEAD + where + _PUSH_DUE_TAIL), params


def pushed_of(rows: Sequence[Any]) -> list[tuple[str, datetime]]:
    """(id, created_at) of the signals a push made due."""
    return [(r["id"], r["created_at"]) for r in rows]


def signal_oldest_due_age(session: Connection, namespace: str | None = None) -> float:
    """Seconds since the oldest due check of waiting signals (in `namespace`,
    or in all) fell due; 0 when none is due."""
    sql = (
        "SELECT extract(epoch FROM now() - min(next_check_at)) FROM signals"
        " WHERE status = 'waiting' AND next_check_at <= now()"
    )
    if namespace is not None:
        sql += " AND namespace = :ns"
    row = runner.one(session, runner.variant("signal_oldest_due_age", sql), {"ns": namespace})
    return float((row and row["extract"]) or 0.0)
