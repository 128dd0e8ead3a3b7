"""Repository of the dead-letter webhook's outbox (`webhook_deliveries`).

A delivery is taken with `FOR UPDATE SKIP LOCKED` and a lease, sent with no
lock held, and its outcome written by an update guarded by its state and its
attempt number (the fence): a holder whose lease lapsed writes nothing.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, RowMapping, text

from app.db.due import due_or_lost
from app.db.rows import every, first, touched_one


def delivery_insert(session: Connection, dead_letter_id: str, body: str) -> bool:
    """One delivery per dead letter, whatever the retries of the caller."""
    return touched_one(
        session,
        "INSERT INTO webhook_deliveries (dead_letter_id, body) VALUES (:id, :body)"
        " ON CONFLICT (dead_letter_id) DO NOTHING",
        {"id": dead_letter_id, "body": body},
    )


_MARK_DUE_ENQUEUED = text(
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
            """
)


def delivery_mark_due_enqueued(
    session: Connection, *, requeue_after_seconds: float, limit: int
) -> list[str]:
    """Stamp and return the due deliveries that need a task sent: due, not
    under a live lease, and no task sent since they became due (or the last
    one was not taken within `requeue_after_seconds`: lost)."""
    return list(
        session.execute(
            _MARK_DUE_ENQUEUED, {"requeue": requeue_after_seconds, "limit": limit}
        ).scalars()
    )


def delivery_take(
    session: Connection, dead_letter_id: str, *, lease_seconds: float
) -> RowMapping | None:
    """Take the delivery for one attempt if it is due and nobody holds it:
    bumps `attempts` (the fence) and stamps a lease. None otherwise."""
    return first(
        session,
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
        {"id": dead_letter_id, "lease": lease_seconds},
    )


def delivery_mark_delivered(
    session: Connection, delivery_id: int, attempts: int, *, status: int
) -> bool:
    return touched_one(
        session,
        "UPDATE webhook_deliveries SET state = 'delivered', delivered_at = now(),"
        " last_status = :status, last_error = NULL, lease_until = NULL"
        " WHERE id = :id AND state = 'pending' AND attempts = :attempts",
        {"id": delivery_id, "attempts": attempts, "status": status},
    )


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
    return touched_one(
        session,
        """
                    UPDATE webhook_deliveries
                       SET state = CASE WHEN :give_up THEN 'failed' ELSE 'pending' END,
                           next_attempt_at = :next_at, last_status = :status,
                           last_error = left(:error, 200), lease_until = NULL
                     WHERE id = :id AND state = 'pending' AND attempts = :attempts
        """,
        {
            "id": delivery_id,
            "attempts": attempts,
            "status": status,
            "error": error,
            "next_at": next_attempt_at,
            "give_up": give_up,
        },
    )


def delivery_count_by_state(session: Connection, namespace: str | None) -> dict[str, int]:
    sql = "SELECT w.state, count(*) FROM webhook_deliveries w"
    if namespace is not None:
        sql += " JOIN dead_letters d ON d.id = w.dead_letter_id WHERE d.namespace = :ns"
    rows = session.execute(text(sql + " GROUP BY 1"), {"ns": namespace}).all()
    return {r[0]: int(r[1]) for r in rows}


def delivery_list_failing(
    session: Connection, namespace: str | None, limit: int
) -> list[RowMapping]:
    """Deliveries whose last attempt failed (pending with attempts, or failed), newest first."""
    sql = (
        "SELECT w.*, d.namespace FROM webhook_deliveries w"
        " JOIN dead_letters d ON d.id = w.dead_letter_id"
        " WHERE (w.state = 'failed' OR (w.state = 'pending' AND w.attempts > 0))"
    )
    if namespace is not None:
        sql += " AND d.namespace = :ns"
    return list(
        every(
            session,
            sql + " ORDER BY w.last_attempt_at DESC NULLS LAST LIMIT :limit",
            {"ns": namespace, "limit": limit},
        )
    )
