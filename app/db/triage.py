"""Repository of triage reads and bulk moves: the checks timeline, dead letters
across namespaces, and the counts of the console's overview.

`namespace=None` means every namespace (an operator); callers pass the scope
`Principal.scope()` gives, never a namespace taken from a tenant's input.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, text
from sqlalchemy.orm import Session

# Columns a dead-letter filter may name (the keys are the API's field names).
DEAD_LETTER_FILTERS = ("state", "reason", "provider", "run_id", "namespace")


def check_list(
    session: Session, signal_id: str, *, after: tuple[datetime, int] | None, limit: int
) -> Sequence[RowMapping]:
    """A signal's checks, oldest first (every generation: redrives keep history)."""
    params: dict[str, Any] = {"sid": signal_id, "limit": limit}
    cursor_sql = ""
    if after is not None:
        cursor_sql = " AND (started_at, id) > (:after_ts, :after_id)"
        params.update(after_ts=after[0], after_id=after[1])
    return (
        session.execute(
            text(
                "SELECT id, signal_id, generation, reason, outcome, error_code, started_at,"
                " finished_at, messages_seen FROM checks WHERE signal_id = :sid"
                + cursor_sql
                + " ORDER BY started_at, id LIMIT :limit"
            ),
            params,
        )
        .mappings()
        .all()
    )


def _dead_letter_where(
    namespace: str | None, filters: dict[str, str | None]
) -> tuple[list[str], dict[str, Any]]:
    where: list[str] = []
    params: dict[str, Any] = {}
    if namespace is not None:
        where.append("namespace = :scope")
        params["scope"] = namespace
    for column in DEAD_LETTER_FILTERS:
        value = filters.get(column)
        if value is not None:
            where.append(f"{column} = :f_{column}")
            params[f"f_{column}"] = value
    return where or ["true"], params


def dead_letter_find(
    session: Session,
    namespace: str | None,
    filters: dict[str, str | None],
    *,
    after: tuple[datetime, str] | None,
    limit: int,
) -> Sequence[RowMapping]:
    """Dead letters in `namespace` (None: all) matching `filters`, oldest first."""
    where, params = _dead_letter_where(namespace, filters)
    if after is not None:
        where.append("(created_at, id) > (:after_ts, :after_id)")
        params.update(after_ts=after[0], after_id=after[1])
    params["limit"] = limit
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


def dead_letter_lock_open(
    session: Session,
    namespace: str | None,
    filters: dict[str, str | None],
    *,
    skip: Sequence[str],
    limit: int,
) -> Sequence[RowMapping]:
    """Lock up to `limit` open dead letters matching `filters` for a bulk move.

    Rows another transaction holds are skipped (it is moving them); `skip`
    leaves out rows this bulk move already gave up on.
    """
    where, params = _dead_letter_where(namespace, {**filters, "state": "open"})
    if skip:
        where.append("id <> ALL(:skip)")
        params["skip"] = list(skip)
    params["limit"] = limit
    return (
        session.execute(
            text(
                "SELECT * FROM dead_letters WHERE "
                + " AND ".join(where)
                + " ORDER BY created_at, id LIMIT :limit FOR UPDATE SKIP LOCKED"
            ),
            params,
        )
        .mappings()
        .all()
    )


def signal_list_by_run_any(
    session: Session, namespace: str | None, run_id: str, *, limit: int
) -> Sequence[RowMapping]:
    """A run's signals in `namespace`, or in every namespace when None."""
    sql = "SELECT * FROM signals WHERE run_id = :run"
    if namespace is not None:
        sql += " AND namespace = :ns"
    return (
        session.execute(
            text(sql + " ORDER BY created_at, id LIMIT :limit"),
            {"run": run_id, "ns": namespace, "limit": limit},
        )
        .mappings()
        .all()
    )


def signal_count_by_namespace_provider_status(
    session: Session, namespace: str | None
) -> list[tuple[str, str, str, int]]:
    sql = "SELECT namespace, provider, status, count(*) FROM signals"
    if namespace is not None:
        sql += " WHERE namespace = :ns"
    rows = session.execute(
        text(sql + " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"), {"ns": namespace}
    ).all()
    return [(r[0], r[1], r[2], int(r[3])) for r in rows]


def signal_oldest_due_age_in(session: Session, namespace: str | None) -> float:
    sql = (
        "SELECT extract(epoch FROM now() - min(next_check_at)) FROM signals"
        " WHERE status = 'waiting' AND next_check_at <= now()"
    )
    if namespace is not None:
        sql += " AND namespace = :ns"
    age = session.execute(text(sql), {"ns": namespace}).scalar_one_or_none()
    return float(age or 0.0)


def dead_letter_count_open_by_namespace(session: Session, namespace: str | None) -> dict[str, int]:
    sql = "SELECT namespace, count(*) FROM dead_letters WHERE state = 'open'"
    if namespace is not None:
        sql += " AND namespace = :ns"
    rows = session.execute(text(sql + " GROUP BY 1 ORDER BY 1"), {"ns": namespace}).all()
    return {r[0]: int(r[1]) for r in rows}


def token_hashes_of_namespace(session: Session, namespace: str) -> list[str]:
    """The stored hashes of a namespace's tokens (`token create`)."""
    return list(
        session.execute(
            text("SELECT token_hash FROM api_tokens WHERE namespace = :ns"), {"ns": namespace}
        ).scalars()
    )
