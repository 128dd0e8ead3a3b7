"""Repository of dead letters: every SQL statement that touches `dead_letters`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import RowMapping, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from app.db.repository import affected
from app.domain.states import DeadLetterState, dead_letter_transition


def dead_letter_insert(session: Session, values: Mapping[Any, Any]) -> str | None:
    """Record a dead letter once per (signal, generation); returns its id if new."""
    return session.execute(
        text(
            """
            INSERT INTO dead_letters (id, signal_id, generation, namespace, run_id, provider,
                reason, checks_total, checks_by_outcome, last_error_code, near_misses,
                recommendation, publish_attempt_at)
            VALUES (:id, :signal_id, :generation, :namespace, :run_id, :provider, :reason,
                :checks_total, :checks_by_outcome, :last_error_code, :near_misses,
                :recommendation, now())
            ON CONFLICT (signal_id, generation) DO NOTHING
            RETURNING id
            """
        ).bindparams(
            bindparam("checks_by_outcome", type_=JSONB), bindparam("near_misses", type_=JSONB)
        ),
        dict(values),
    ).scalar_one_or_none()


def dead_letter_get(
    session: Session, dead_letter_id: str, namespace: str | None
) -> RowMapping | None:
    sql = "SELECT * FROM dead_letters WHERE id = :id"
    if namespace is not None:
        sql += " AND namespace = :ns"
    return session.execute(text(sql), {"id": dead_letter_id, "ns": namespace}).mappings().first()


def dead_letter_take_alert(session: Session, dead_letter_id: str) -> RowMapping | None:
    """Mark the dead letter alerted and read it, unless it was alerted
    already (or does not exist): then None."""
    return (
        session.execute(
            text(
                "UPDATE dead_letters SET alerted_at = now()"
                " WHERE id = :id AND alerted_at IS NULL RETURNING *"
            ),
            {"id": dead_letter_id},
        )
        .mappings()
        .first()
    )


def dead_letter_latest_many(session: Session, signal_ids: Sequence[str]) -> dict[str, RowMapping]:
    rows = (
        session.execute(
            text(
                "SELECT DISTINCT ON (signal_id) * FROM dead_letters WHERE signal_id = ANY(:ids)"
                " ORDER BY signal_id, generation DESC"
            ),
            {"ids": list(signal_ids)},
        )
        .mappings()
        .all()
    )
    return {r["signal_id"]: r for r in rows}


def dead_letter_list(
    session: Session,
    namespace: str | None,
    *,
    state: str | None,
    reason: str | None,
    provider: str | None,
    run_id: str | None = None,
    after: tuple[Any, str] | None,
    limit: int,
) -> Sequence[RowMapping]:
    where = ["true"]
    params: dict[str, Any] = {"limit": limit}
    for column, value in (
        ("namespace", namespace),
        ("state", state),
        ("reason", reason),
        ("provider", provider),
        ("run_id", run_id),
    ):
        if value is not None:
            where.append(f"{column} = :{column}")
            params[column] = value
    if after is not None:
        where.append("(created_at, id) > (:after_ts, :after_id)")
        params.update(after_ts=after[0], after_id=after[1])
    return (
        session.execute(
            text(
                "SELECT * FROM dead_letters WHERE "
                + " AND ".join(where)
                + " ORDER BY created_at, id LIMIT :limit"
            ),
            params,
        )
        .mappings()
        .all()
    )


def dead_letter_resolve(
    session: Session, dead_letter_id: str, *, to_state: str, note: str | None
) -> RowMapping | None:
    """open → redriven | discarded; None if it was not open any more."""
    src, dst = dead_letter_transition(DeadLetterState.OPEN, DeadLetterState(to_state))
    return (
        session.execute(
            text(
                "UPDATE dead_letters SET state = :dst, note = coalesce(:note, note),"
                " resolved_at = now() WHERE id = :id AND state = :src RETURNING *"
            ),
            {"id": dead_letter_id, "src": src, "dst": dst, "note": note},
        )
        .mappings()
        .first()
    )


def dead_letter_take_unpublished(
    session: Session, *, lease_seconds: float, limit: int
) -> list[str]:
    """Take (lease) dead letters committed but not published, whose last
    attempt is older than `lease_seconds` (the creator attempts at once):
    two sweeps never take the same one."""
    return list(
        session.execute(
            text(
                """
                UPDATE dead_letters SET publish_attempt_at = now()
                 WHERE id IN (
                    SELECT id FROM dead_letters
                     WHERE published_at IS NULL
                       AND (publish_attempt_at IS NULL
                            OR publish_attempt_at < now() - make_interval(secs => :lease))
                     ORDER BY created_at LIMIT :limit FOR UPDATE SKIP LOCKED)
                RETURNING id
                """
            ),
            {"lease": lease_seconds, "limit": limit},
        ).scalars()
    )


def dead_letter_mark_published(session: Session, ids: Sequence[str]) -> None:
    session.execute(
        text("UPDATE dead_letters SET published_at = now() WHERE id = ANY(:ids)"),
        {"ids": list(ids)},
    )


def dead_letter_count_by_reason_state(session: Session) -> dict[tuple[str, str], int]:
    rows = session.execute(
        text("SELECT reason, state, count(*) FROM dead_letters GROUP BY reason, state")
    ).all()
    return {(r[0], r[1]): int(r[2]) for r in rows}


# ---------------------------------------------------------------- late mail

# Dead letters whose signal may still receive its mail late: open, not yet
# given a late message, and within a day of the deadline.
_LATE_WATCH = """
    FROM dead_letters d JOIN signals s ON s.id = d.signal_id AND s.generation = d.generation
   WHERE d.state = 'open' AND d.late_message IS NULL
     AND d.reason <> 'claims_exhausted' AND s.status = 'expired'
     AND s.expires_at > now() - interval '24 hours'
"""


def dead_letter_late_providers(session: Session) -> list[str]:
    """Providers that have dead letters whose mail may still arrive late."""
    return list(session.execute(text("SELECT DISTINCT d.provider" + _LATE_WATCH)).scalars())


def dead_letter_late_watch(session: Session, provider: str, limit: int) -> Sequence[RowMapping]:
    """The watched dead letters of `provider` with what matching needs."""
    return (
        session.execute(
            text(
                """
                SELECT d.id, d.signal_id, d.reason, d.checks_by_outcome, d.last_error_code,
                       d.near_misses, s.namespace, s.run_id, s.recipient, s.received_after,
                       s.subject_contains, s.body_contains, s.require_run_marker,
                       s.expires_at, s.expired_at, s.provider
                """
                + _LATE_WATCH
                + " AND d.provider = :p ORDER BY d.created_at DESC LIMIT :limit"
            ),
            {"p": provider, "limit": limit},
        )
        .mappings()
        .all()
    )


def dead_letter_set_late(
    session: Session, dead_letter_id: str, late_message: Mapping[str, Any], recommendation: str
) -> bool:
    """Link the late message (once) and restate the recommendation."""
    result = session.execute(
        text(
            "UPDATE dead_letters SET late_message = :late, recommendation = :rec"
            " WHERE id = :id AND late_message IS NULL"
        ).bindparams(bindparam("late", type_=JSONB)),
        {"id": dead_letter_id, "late": dict(late_message), "rec": recommendation},
    )
    return affected(result) == 1
