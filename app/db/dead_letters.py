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

from psycopg.types.json import Jsonb
from sqlalchemy import Connection

from app.db import runner
from app.db.pagination import BY_CREATION
from app.db.records import DeadLetterRow, IdRow
from app.db.runner import Statement
from app.domain.states import DeadLetterState, dead_letter_transition

_INSERT: Statement[IdRow] = Statement(
    "dead_letter_insert",
    """
            INSERT INTO dead_letters (id, signal_id, generation, namespace, run_id, provider,
                reason, checks_total, checks_by_outcome, last_error_code, near_misses,
                recommendation, duplicates, publish_attempt_at)
            VALUES (:id, :signal_id, :generation, :namespace, :run_id, :provider, :reason,
                :checks_total, :checks_by_outcome, :last_error_code, :near_misses,
                :recommendation, :duplicates, now())
            ON CONFLICT (signal_id, generation) DO NOTHING
            RETURNING id
            """,
)


def dead_letter_insert(session: Connection, values: Mapping[Any, Any]) -> str | None:
    """Record a dead letter once per (signal, generation); returns its id if new."""
    params = {"duplicates": None, **values}
    # JSONB parameters; `duplicates` None is SQL NULL, the others' None JSON null.
    params["checks_by_outcome"] = Jsonb(params["checks_by_outcome"])
    params["near_misses"] = Jsonb(params["near_misses"])
    if params["duplicates"] is not None:
        params["duplicates"] = Jsonb(params["duplicates"])
    row = runner.one(session, _INSERT, params)
    return None if row is None else row["id"]


_GET: Statement[DeadLetterRow] = Statement(
    "dead_letter_get", "SELECT * FROM dead_letters WHERE id = :id"
)
_GET_IN: Statement[DeadLetterRow] = Statement(
    "dead_letter_get_in_namespace", _GET.sql + " AND namespace = :ns"
)
_TAKE_ALERT: Statement[DeadLetterRow] = Statement(
    "dead_letter_take_alert",
    "UPDATE dead_letters SET alerted_at = now() WHERE id = :id AND alerted_at IS NULL RETURNING *",
)
_LATEST_MANY: Statement[DeadLetterRow] = Statement(
    "dead_letter_latest_many",
    "SELECT DISTINCT ON (signal_id) * FROM dead_letters WHERE signal_id = ANY(:ids)"
    " ORDER BY signal_id, generation DESC",
)


def dead_letter_get(
    session: Connection, dead_letter_id: str, namespace: str | None
) -> DeadLetterRow | None:
    stmt = _GET if namespace is None else _GET_IN
    return runner.one(session, stmt, {"id": dead_letter_id, "ns": namespace})


def dead_letter_take_alert(session: Connection, dead_letter_id: str) -> DeadLetterRow | None:
    """Mark the dead letter alerted and read it, unless it was alerted
    already (or does not exist): then None."""
    return runner.one(session, _TAKE_ALERT, {"id": dead_letter_id})


def dead_letter_latest_many(
    session: Connection, signal_ids: Sequence[str]
) -> dict[str, DeadLetterRow]:
    """The latest dead letter of each signal (its highest generation)."""
    rows = runner.all(session, _LATEST_MANY, {"ids": list(signal_ids)})
    return {r["signal_id"]: r for r in rows}


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
) -> list[DeadLetterRow]:
    """One page of the dead letters in `namespace` (None: all) matching
    `filters`, oldest first, after the cursor `after`."""
    params: dict[str, Any] = {}
    where = _dead_letter_where(namespace, filters, params)
    where.append(BY_CREATION.after(after, params))
    sql = "SELECT * FROM dead_letters WHERE " + " AND ".join(where)
    return runner.all(
        session, runner.variant("dead_letter_list", sql + BY_CREATION.page(limit, params)), params
    )


def dead_letter_lock_open(
    session: Connection,
    namespace: str | None,
    filters: Mapping[str, str | None],
    *,
    skip: Sequence[str],
    limit: int,
) -> list[DeadLetterRow]:
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
    sql += BY_CREATION.page(limit, params) + " FOR UPDATE SKIP LOCKED"
    return runner.all(session, runner.variant("dead_letter_lock_open", sql), params)


_RESOLVE: Statement[DeadLetterRow] = Statement(
    "dead_letter_resolve",
    "UPDATE dead_letters SET state = :dst, note = coalesce(:note, note),"
    " resolved_at = now() WHERE id = :id AND state = :src RETURNING *",
)


def dead_letter_resolve(
    session: Connection, dead_letter_id: str, *, to_state: str, note: str | None
) -> DeadLetterRow | None:
    """open → redriven | discarded; None if it was not open any more."""
    src, dst = dead_letter_transition(DeadLetterState.OPEN, DeadLetterState(to_state))
    return runner.one(
        session,
        _RESOLVE,
        {"id": dead_letter_id, "src": src, "dst": dst, "note": note},
    )


def dead_letter_take_unpublished(
    session: Connection, *, lease_seconds: float, limit: int
) -> list[str]:
    """Take (lease) dead letters committed but not published, whose last
    attempt is older than `lease_seconds` (the creator attempts at once):
    two sweeps never take the same one."""
    rows = runner.all(session, _TAKE_UNPUBLISHED, {"lease": lease_seconds, "limit": limit})
    return [r["id"] for r in rows]


def _take(name: str, where: str, order_by: str) -> Statement[IdRow]:
    """A take: stamp the attempt on the oldest (by `order_by`) `:limit` dead
    letters that `where` picks, skipping those another transaction holds;
    their ids. A taken one is not taken again until its attempt is old."""
    return Statement(
        name,
        f"""
                UPDATE dead_letters SET publish_attempt_at = now()
                 WHERE id IN (
                    SELECT id FROM dead_letters
                     WHERE {where}
                     ORDER BY {order_by} LIMIT :limit FOR UPDATE SKIP LOCKED)
                RETURNING id
                """,
    )


def _attempt_before(secs: str) -> str:
    """Never attempted, or last attempted more than `secs` (a parameter) ago."""
    return f"""(publish_attempt_at IS NULL
                            OR publish_attempt_at < now() - make_interval(secs => {secs}))"""


_TAKE_UNPUBLISHED = _take(
    "dead_letter_take_unpublished",
    f"published_at IS NULL AND {_attempt_before(':lease')}",
    "created_at",
)


def dead_letter_take_unalerted(
    session: Connection, *, after_seconds: float, limit: int
) -> list[str]:
    """Take dead letters published `after_seconds` ago or more and still not
    alerted, whose last send is as old: their message was lost or is held by
    a consumer that died (Redis gives it back only after its visibility
    timeout). Each is taken at most once per `after_seconds`, so a slow
    consumer's backlog gains one copy per dead letter per period, no more."""
    rows = runner.all(session, _TAKE_UNALERTED, {"after": after_seconds, "limit": limit})
    return [r["id"] for r in rows]


_TAKE_UNALERTED = _take(
    "dead_letter_take_unalerted",
    f"""alerted_at IS NULL AND published_at IS NOT NULL
                       AND published_at < now() - make_interval(secs => :after)
                       AND {_attempt_before(":after")}""",
    "published_at",
)


_MARK_PUBLISHED: Statement = Statement(
    "dead_letter_mark_published",
    "UPDATE dead_letters SET published_at = now() WHERE id = ANY(:ids)",
)
_COUNT_BY_REASON_STATE_NAMESPACE: Statement = Statement(
    "dead_letter_count_by_reason_state_namespace",
    "SELECT reason, state, namespace, count(*) FROM dead_letters GROUP BY reason, state, namespace",
)


def dead_letter_mark_published(session: Connection, ids: Sequence[str]) -> None:
    runner.exec(session, _MARK_PUBLISHED, {"ids": list(ids)})


def dead_letter_count_by_reason_state_namespace(
    session: Connection,
) -> dict[tuple[str, str, str], int]:
    rows = runner.all(session, _COUNT_BY_REASON_STATE_NAMESPACE)
    return {(r["reason"], r["state"], r["namespace"]): int(r["count"]) for r in rows}


def dead_letter_count_open_by_namespace(
    session: Connection, namespace: str | None
) -> dict[str, int]:
    sql = "SELECT namespace, count(*) FROM dead_letters WHERE state = 'open'"
    if namespace is not None:
        sql += " AND namespace = :ns"
    stmt = runner.variant("dead_letter_count_open_by_namespace", sql + " GROUP BY 1 ORDER BY 1")
    rows = runner.all(session, stmt, {"ns": namespace})
    return {r["namespace"]: int(r["count"]) for r in rows}


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


_LATE_PROVIDERS: Statement = Statement(
    "dead_letter_late_providers", "SELECT DISTINCT d.provider" + _LATE_WATCH
)


def dead_letter_late_providers(session: Connection) -> list[str]:
    """Providers that have dead letters whose mail may still arrive late."""
    return [r["provider"] for r in runner.all(session, _LATE_PROVIDERS)]


def dead_letter_late_watch(session: Connection, provider: str, limit: int) -> list[dict[str, Any]]:
    """The watched dead letters of `provider` with what matching needs."""
    return runner.all(session, _LATE_WATCH_ROWS, {"p": provider, "limit": limit})


_LATE_WATCH_ROWS: Statement = Statement(
    "dead_letter_late_watch",
    """
        SELECT d.id, d.signal_id, d.reason, d.checks_by_outcome, d.last_error_code,
               d.near_misses, s.namespace, s.run_id, s.recipient, s.received_after,
               s.subject_contains, s.body_contains, s.require_run_marker,
               s.expires_at, s.expired_at, s.provider
        """
    + _LATE_WATCH
    + " AND d.provider = :p ORDER BY d.created_at DESC LIMIT :limit",
)
_SET_LATE: Statement = Statement(
    "dead_letter_set_late",
    "UPDATE dead_letters SET late_message = :late, recommendation = :rec"
    " WHERE id = :id AND late_message IS NULL",
)
_LIST_FOR_SIGNAL: Statement[DeadLetterRow] = Statement(
    "dead_letter_list_for_signal",
    "SELECT * FROM dead_letters WHERE signal_id = :id ORDER BY generation",
)


def dead_letter_set_late(
    session: Connection, dead_letter_id: str, late_message: Mapping[str, Any], recommendation: str
) -> bool:
    """Link the late message (once) and restate the recommendation."""
    params = {"id": dead_letter_id, "late": Jsonb(dict(late_message)), "rec": recommendation}
    return runner.exec(session, _SET_LATE, params) == 1


def dead_letter_list_for_signal(session: Connection, signal_id: str) -> list[DeadLetterRow]:
    """Every dead letter of the signal, one per expiry, oldest first (its timeline)."""
    return runner.all(session, _LIST_FOR_SIGNAL, {"id": signal_id})


# ---------------------------------------------------------------- causes

# The first near miss's why, or 'none': one part of a dead letter's cause.
_WHY = "coalesce(d.near_misses->0->>'why', 'none')"


def dead_letter_causes(
    session: Connection, namespace: str | None, *, since: datetime | None, limit: int
) -> list[dict[str, Any]]:
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
    sql = f"""
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
        """
    return runner.all(session, runner.variant("dead_letter_causes", sql), params)
