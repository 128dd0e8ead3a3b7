"""Repository of dead letters: every SQL statement that touches `dead_letters`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import RowMapping, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session


def dead_letter_insert(session: Session, values: Mapping[Any, Any]) -> str | None:
    """Record a dead letter once per (signal, generation); returns its id if new."""
    return session.execute(
        text(
            """
            INSERT INTO dead_letters (id, signal_id, generation, namespace, run_id, provider,
                reason, checks_total, checks_by_outcome, last_error_code, near_misses,
                recommendation)
            VALUES (:id, :signal_id, :generation, :namespace, :run_id, :provider, :reason,
                :checks_total, :checks_by_outcome, :last_error_code, :near_misses,
                :recommendation)
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
    return (
        session.execute(
            text(
                "UPDATE dead_letters SET state = :to, note = coalesce(:note, note),"
                " resolved_at = now() WHERE id = :id AND state = 'open' RETURNING *"
            ),
            {"id": dead_letter_id, "to": to_state, "note": note},
        )
        .mappings()
        .first()
    )


def dead_letter_unpublished(session: Session, older_than_seconds: float, limit: int) -> list[str]:
    return list(
        session.execute(
            text(
                "SELECT id FROM dead_letters WHERE published_at IS NULL"
                " AND created_at < now() - make_interval(secs => :age)"
                " ORDER BY created_at LIMIT :limit FOR UPDATE SKIP LOCKED"
            ),
            {"age": older_than_seconds, "limit": limit},
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
