"""Repository of dead letters (`dead_letters`): one per expiry of a signal.

Recorded once per (signal, generation) and published through an outbox
(`dead_letter_take_unpublished`, `dead_letter_mark_published`); listed and
locked for triage by the API's filters; resolved `open` → `redriven` |
`discarded` by a guarded update; counted for the gauges and the console; and
watched for mail that arrives after the deadline (late mail).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB

from app.db.pagination import BY_CREATION
from app.db.rows import by_column, every, first, touched_one
from app.domain.states import DeadLetterState, dead_letter_transition


def dead_letter_insert(session: Connection, values: Mapping[Any, Any]) -> str | None:
    """Record a dead letter once per (signal, generation); returns its id if new."""
    return session.execute(
        text(
            """
            INSERT INTO dead_letters (id, signal_id, generation, namespace, run_id, provider,
                reason, checks_total, checks_by_outcome, last_error_code, near_misses,
                recommendation, duplicates, publish_attempt_at)
            VALUES (:id, :signal_id, :generation, :namespace, :run_id, :provider, :reason,
                :checks_total, :checks_by_outcome, :last_error_code, :near_misses,
                :recommendation, :duplicates, now())
            ON CONFLICT (signal_id, generation) DO NOTHING
            RETURNING id
            """
        ).bindparams(
            bindparam("checks_by_outcome", type_=JSONB),
            bindparam("near_misses", type_=JSONB),
            bindparam("duplicates", type_=JSONB(none_as_null=True)),
        ),
        {"duplicates": None, **values},
    ).scalar_one_or_none()


def dead_letter_get(
    session: Connection, dead_letter_id: str, namespace: str | None
) -> RowMapping | None:
    sql = "SELECT * FROM dead_letters WHERE id = :id"
    if namespace is not None:
        sql += " AND namespace = :ns"
    return first(session, sql, {"id": dead_letter_id, "ns": namespace})


def dead_letter_take_alert(session: Connection, dead_letter_id: str) -> RowMapping | None:
    """Mark the dead letter alerted and read it, unless it was alerted
    already (or does not exist): then None."""
    return first(
        session,
        "UPDATE dead_letters SET alerted_at = now()"
        " WHERE id = :id AND alerted_at IS NULL RETURNING *",
        {"id": dead_letter_id},
    )


def dead_letter_latest_many(
    session: Connection, signal_ids: Sequence[str]
) -> dict[str, RowMapping]:
    """The latest dead letter of each signal (its highest generation)."""
    return by_column(
        session,
        "SELECT DISTINCT ON (signal_id) * FROM dead_letters WHERE signal_id = ANY(:ids)"
        " ORDER BY signal_id, generation DESC",
        {"ids": list(signal_ids)},
    )


# Columns a dead-letter filter may name (the keys are the API's field names).
DEAD_LETTER_FILTERS = ("state", "reason", "provider", "run_id", "namespace")
# The parts of a cause (GET /v1/dead-letters/causes) a filter may also name.
_CAUSE_FILTERS = {
    "why": "coalesce(near_misses->0->>'why', 'none') = :f_why",
    "test_case": "signal_id IN (SELECT id FROM signals WHERE test_case = :f_test_case)",
}


def _dead_letter_where(
    namespace: str | None, filters: Mapping[str, str | None], params: dict[str, Any]
) -> list[str]:
    """The conditions of a dead-letter filter, their values put in `params`.
    `namespace` is the caller's scope (None: every namespace, an operator),
    never a namespace taken from a tenant's input."""
    where = ["true"]
    if namespace is not None:
        where.append("namespace = :scope")
        params["scope"] = namespace
    for column in DEAD_LETTER_FILTERS:
        value = filters.get(column)
        if value is not None:
            where.append(f"{column} = :f_{column}")
            params[f"f_{column}"] = value
    for name, condition in _CAUSE_FILTERS.items():
        value = filters.get(name)
        if value is not None:
            where.append(condition)
            params[f"f_{name}"] = value
    return where


def dead_letter_list(
    session: Connection,
    namespace: str | None,
    filters: Mapping[str, str | None],
    *,
    after: tuple[datetime, str] | None,
    limit: int,
) -> Sequence[RowMapping]:
    """One page of the dead letters in `namespace` (None: all) matching
    `filters`, oldest first, after the cursor `after`."""
    params: dict[str, Any] = {}
    where = _dead_letter_where(namespace, filters, params)
    where.append(BY_CREATION.after(after, params))
    sql = "SELECT * FROM dead_letters WHERE " + " AND ".join(where)
    return every(session, sql + BY_CREATION.page(limit, params), params)


def dead_letter_lock_open(
    session: Connection,
    namespace: str | None,
    filters: Mapping[str, str | None],
    *,
    skip: Sequence[str],
    limit: int,
) -> Sequence[RowMapping]:
    """Lock up to `limit` open dead letters matching `filters` for a bulk move.

    Rows another transaction holds are skipped (it is moving them); `skip`
    leaves out rows this bulk move already gave up on.
    """
    params: dict[str, Any] = {}
    where = _dead_letter_where(namespace, {**filters, "state": "open"}, params)
    if skip:
        where.append("id <> ALL(:skip)")
        params["skip"] = list(skip)
    sql = "SELECT * FROM dead_letters WHERE " + " AND ".join(where)
    return every(session, sql + BY_CREATION.page(limit, params) + " FOR UPDATE SKIP LOCKED", params)


def dead_letter_resolve(
    session: Connection, dead_letter_id: str, *, to_state: str, note: str | None
) -> RowMapping | None:
    """open → redriven | discarded; None if it was not open any more."""
    src, dst = dead_letter_transition(DeadLetterState.OPEN, DeadLetterState(to_state))
    return first(
        session,
        "UPDATE dead_letters SET state = :dst, note = coalesce(:note, note),"
        " resolved_at = now() WHERE id = :id AND state = :src RETURNING *",
        {"id": dead_letter_id, "src": src, "dst": dst, "note": note},
    )


def dead_letter_take_unpublished(
    session: Connection, *, lease_seconds: float, limit: int
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


def dead_letter_take_unalerted(
    session: Connection, *, after_seconds: float, limit: int
) -> list[str]:
    """Take dead letters published `after_seconds` ago or more and still not
    alerted, whose last send is as old: their message was lost or is held by
    a consumer that died (Redis gives it back only after its visibility
    timeout). Each is taken at most once per `after_seconds`, so a slow
    consumer's backlog gains one copy per dead letter per period, no more."""
    return list(
        session.execute(
            text(
                """
                UPDATE dead_letters SET publish_attempt_at = now()
                 WHERE id IN (
                    SELECT id FROM dead_letters
                     WHERE alerted_at IS NULL AND published_at IS NOT NULL
                       AND published_at < now() - make_interval(secs => :after)
                       AND (publish_attempt_at IS NULL
                            OR publish_attempt_at < now() - make_interval(secs => :after))
                     ORDER BY published_at LIMIT :limit FOR UPDATE SKIP LOCKED)
                RETURNING id
                """
            ),
            {"after": after_seconds, "limit": limit},
        ).scalars()
    )


def dead_letter_mark_published(session: Connection, ids: Sequence[str]) -> None:
    session.execute(
        text("UPDATE dead_letters SET published_at = now() WHERE id = ANY(:ids)"),
        {"ids": list(ids)},
    )


def dead_letter_count_by_reason_state_namespace(
    session: Connection,
) -> dict[tuple[str, str, str], int]:
    rows = session.execute(
        text(
            "SELECT reason, state, namespace, count(*) FROM dead_letters"
            " GROUP BY reason, state, namespace"
        )
    ).all()
    return {(r[0], r[1], r[2]): int(r[3]) for r in rows}


def dead_letter_count_open_by_namespace(
    session: Connection, namespace: str | None
) -> dict[str, int]:
    sql = "SELECT namespace, count(*) FROM dead_letters WHERE state = 'open'"
    if namespace is not None:
        sql += " AND namespace = :ns"
    rows = session.execute(text(sql + " GROUP BY 1 ORDER BY 1"), {"ns": namespace}).all()
    return {r[0]: int(r[1]) for r in rows}


# ---------------------------------------------------------------- late mail

# Dead letters whose signal may still receive its mail late: open, not yet
# given a late message, and within a day of the deadline. A signal that had
# its mail (claims used up) or too much of it (duplicate messages) has no
# late mail to wait for.
_LATE_WATCH = """
    FROM dead_letters d JOIN signals s ON s.id = d.signal_id AND s.generation = d.generation
   WHERE d.state = 'open' AND d.late_message IS NULL
     AND d.reason NOT IN ('claims_exhausted', 'duplicate_messages') AND s.status = 'expired'
     AND s.expires_at > now() - interval '24 hours'
"""


def dead_letter_late_providers(session: Connection) -> list[str]:
    """Providers that have dead letters whose mail may still arrive late."""
    return list(session.execute(text("SELECT DISTINCT d.provider" + _LATE_WATCH)).scalars())


def dead_letter_late_watch(session: Connection, provider: str, limit: int) -> Sequence[RowMapping]:
    """The watched dead letters of `provider` with what matching needs."""
    return every(
        session,
        """
        SELECT d.id, d.signal_id, d.reason, d.checks_by_outcome, d.last_error_code,
               d.near_misses, s.namespace, s.run_id, s.recipient, s.received_after,
               s.subject_contains, s.body_contains, s.require_run_marker,
               s.expires_at, s.expired_at, s.provider
        """
        + _LATE_WATCH
        + " AND d.provider = :p ORDER BY d.created_at DESC LIMIT :limit",
        {"p": provider, "limit": limit},
    )


def dead_letter_set_late(
    session: Connection, dead_letter_id: str, late_message: Mapping[str, Any], recommendation: str
) -> bool:
    """Link the late message (once) and restate the recommendation."""
    return touched_one(
        session,
        text(
            "UPDATE dead_letters SET late_message = :late, recommendation = :rec"
            " WHERE id = :id AND late_message IS NULL"
        ).bindparams(bindparam("late", type_=JSONB)),
        {"id": dead_letter_id, "late": dict(late_message), "rec": recommendation},
    )


def dead_letter_list_for_signal(session: Connection, signal_id: str) -> Sequence[RowMapping]:
    """Every dead letter of the signal, one per expiry, oldest first (its timeline)."""
    return every(
        session,
        "SELECT * FROM dead_letters WHERE signal_id = :id ORDER BY generation",
        {"id": signal_id},
    )


# ---------------------------------------------------------------- causes

# The first near miss's why, or 'none': one part of a dead letter's cause.
_WHY = "coalesce(d.near_misses->0->>'why', 'none')"


def dead_letter_causes(
    session: Connection, namespace: str | None, *, since: datetime | None, limit: int
) -> Sequence[RowMapping]:
    """Open dead letters of `namespace` (None: all) created at or after
    `since`, grouped by provider, reason, first near miss's why and test
    case, largest group first, each with its latest dead letter as example."""
    params: dict[str, Any] = {"limit": limit}
    where = ["d.state = 'open'"]
    if namespace is not None:
        where.append("d.namespace = :scope")
        params["scope"] = namespace
    if since is not None:
        where.append("d.created_at >= :since")
        params["since"] = since
    return every(
        session,
        f"""
        SELECT d.provider, d.reason, {_WHY} AS why, coalesce(s.test_case, '') AS test_case,
               count(*) AS count, min(d.created_at) AS first_at, max(d.created_at) AS last_at,
               (array_agg(d.id ORDER BY d.created_at DESC, d.id DESC))[1] AS example_id,
               (array_agg(d.recommendation ORDER BY d.created_at DESC, d.id DESC))[1]
                   AS example_recommendation
          FROM dead_letters d LEFT JOIN signals s ON s.id = d.signal_id
         WHERE {" AND ".join(where)}
         GROUP BY 1, 2, 3, 4
         ORDER BY count(*) DESC, max(d.created_at) DESC, 1, 2, 3, 4
         LIMIT :limit
        """,
        params,
    )
