"""Repository of the dead-letter webhook's outbox (`webhook_deliveries`).

A delivery is taken with `FOR UPDATE SKIP LOCKED` and a lease, sent with no
lock held, and its outcome written by an update guarded by its state and its
attempt number (the fence): a holder whose lease lapsed writes nothing.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from app.db import runner
from app.db.due import due_or_lost
from app.db.records import DeliveryRow
from app.db.runner import Statement

_INSERT: Statement = Statement(
    "delivery_insert",
    "INSERT INTO webhook_deliveries (dead_letter_id, body) VALUES (:id, :body)"
    " ON CONFLICT (dead_letter_id) DO NOTHING",
)


def delivery_insert(session: Connection, dead_letter_id: str, body: str) -> bool:
    """One delivery per dead letter, whatever the retries of the caller."""
    return runner.exec(session, _INSERT, {"id": dead_letter_id, "body": body}) == 1


_MARK_DUE_ENQUEUED: Statement = Statement(
    "delivery_mark_due_enqueued",
    due_or_lost(
        table="webhook_deliveries",
        live="state = 'pending'",
        due_at="next_attempt_at",
        lease_until="lease_until",
        lost_after=":requeue",
    )
    + """
            UPDATE webhook_deliveries d SET enqueued_at = now()
              FROM due WHERE d.id = due.id
            RETURNING d.dead_letter_id
            """,
)
_TAKE: Statement[DeliveryRow] = Statement(
    "delivery_take",
    """
                WITH taken AS (
                    SELECT id FROM webhook_deliveries
                     WHERE dead_letter_id = :id AND state = 'pending'
                       AND next_attempt_at <= now()
                       AND (lease_until IS NULL OR lease_until < now())
                     FOR UPDATE SKIP LOCKED
                )
                UPDATE webhook_deliveries d
                   SET attempts = d.attempts + 1, last_attempt_at = now(),
                       lease_until = now() + make_interval(secs => :lease)
                  FROM taken WHERE d.id = taken.id
                RETURNING d.*, now() AS now
        """,
)
_MARK_DELIVERED: Statement = Statement(
    "delivery_mark_delivered",
    "UPDATE webhook_deliveries SET state = 'delivered', delivered_at = now(),"
    " last_status = :status, last_error = NULL, lease_until = NULL"
    " WHERE id = :id AND state = 'pending' AND attempts = :attempts",
)
_MARK_FAILED: Statement = Statement(
    "delivery_mark_failed",
    """
                    UPDATE webhook_deliveries
                       SET state = CASE WHEN :give_up THEN 'failed' ELSE 'pending' END,
                           next_attempt_at = :next_at, last_status = :status,
                           last_error = left(:error, 200), lease_until = NULL
                     WHERE id = :id AND state = 'pending' AND attempts = :attempts
        """,
)


def delivery_mark_due_enqueued(
    session: Connection, *, requeue_after_seconds: float, limit: int
) -> list[str]:
    """Stamp and return the due deliveries that need a task sent: due, not
    under a live lease, and no task sent since they became due (or the last
    one was not taken within `requeue_after_seconds`: lost)."""
    params = {"requeue": requeue_after_seconds, "limit": limit}
    return [r["dead_letter_id"] for r in runner.all(session, _MARK_DUE_ENQUEUED, params)]


def delivery_take(
    session: Connection, dead_letter_id: str, *, lease_seconds: float
) -> DeliveryRow | None:
    """Take the delivery for one attempt if it is due and nobody holds it:
    bumps `attempts` (the fence) and stamps a lease. None otherwise."""
    return runner.one(session, _TAKE, {"id": dead_letter_id, "lease": lease_seconds})


def delivery_mark_delivered(
    session: Connection, delivery_id: int, attempts: int, *, status: int
) -> bool:
    params = {"id": delivery_id, "attempts": attempts, "status": status}
    return runner.exec(session, _MARK_DELIVERED, params) == 1


def delivery_mark_failed(
    session: Connection,
    delivery_id: int,
    attempts: int,
    *,
    status: int | None,
    error: str,
    next_attempt_at: datetime,
    give_up: bool,
) -> bool:
    """Record a failed attempt: due again at `next_attempt_at`, or `failed`
    for good when `give_up`."""
    return (
        runner.exec(
            session,
            _MARK_FAILED,
            {
                "id": delivery_id,
                "attempts": attempts,
                "status": status,
                "error": error,
                "next_at": next_attempt_at,
                "give_up": give_up,
            },
        )
        == 1
    )


def delivery_count_by_state(session: Connection, namespace: str | None) -> dict[str, int]:
    sql = "SELECT w.state, count(*) FROM webhook_deliveries w"
    if namespace is not None:
        sql += " JOIN dead_letters d ON d.id = w.dead_letter_id WHERE d.namespace = :ns"
    stmt = runner.variant("delivery_count_by_state", sql + " GROUP BY 1")
    return {r["state"]: int(r["count"]) for r in runner.all(session, stmt, {"ns": namespace})}


def delivery_list_failing(
    session: Connection, namespace: str | None, limit: int
) -> list[DeliveryRow]:
    """Deliveries whose last attempt failed (pending with attempts, or failed), newest first."""
    sql = (
        "SELECT w.*, d.namespace FROM webhook_deliveries w"
        " JOIN dead_letters d ON d.id = w.dead_letter_id"
        " WHERE (w.state = 'failed' OR (w.state = 'pending' AND w.attempts > 0))"
    )
    if namespace is not None:
        sql += " AND d.namespace = :ns"
    sql += " ORDER BY w.last_attempt_at DESC NULLS LAST LIMIT :limit"
    stmt: Statement[DeliveryRow] = runner.variant("delivery_list_failing", sql)
    return runner.all(session, stmt, {"ns": namespace, "limit": limit})
