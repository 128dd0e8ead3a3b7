"""The repository: every SQL statement of signals, messages, checks and the sink.

Functions are named noun first, then verb. State changes are guarded
(`WHERE id = :id AND status = :expected [AND fence = :fence]`); zero rows back
means someone else moved first, which is a normal outcome (None / False).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

Row = RowMapping


def affected(result: Any) -> int:
    """Rows an UPDATE/INSERT/DELETE touched (0 when its guard did not hold)."""
    return int(getattr(result, "rowcount", 0) or 0)


def db_now(session: Session) -> datetime:
    """The server's clock: the authority for every timestamp."""
    return session.execute(text("SELECT clock_timestamp()")).scalar_one()


# ---------------------------------------------------------------- tokens


def token_namespace(session: Session, token_hash: str) -> str | None:
    return session.execute(
        text("SELECT namespace FROM api_tokens WHERE token_hash = :h"), {"h": token_hash}
    ).scalar_one_or_none()


def token_create(session: Session, namespace: str, token_hash: str) -> None:
    session.execute(
        text("INSERT INTO api_tokens (namespace, token_hash) VALUES (:ns, :h)"),
        {"ns": namespace, "h": token_hash},
    )


# ---------------------------------------------------------------- signals

_SIGNAL_INSERT = text(
    """
    INSERT INTO signals (
        id, namespace, idempotency_key, run_id, test_case, recipient,
        subject_contains, body_contains, received_after, created_at, updated_at,
        expires_at, max_checks, provider, require_run_marker, metadata,
        status, next_check_at, next_check_reason, enqueued_at, max_claims)
    VALUES (
        :id, :namespace, :idempotency_key, :run_id, :test_case, :recipient,
        :subject_contains, :body_contains, coalesce(:received_after, :now), :now, :now,
        :now + make_interval(secs => :expires_in), :max_checks, :provider,
        :require_run_marker, :metadata,
        'waiting', :now, 'first', :now, :max_claims)
    """
).bindparams(bindparam("metadata", type_=JSONB))


def signal_insert(session: Session, values: Mapping[Any, Any]) -> None:
    session.execute(_SIGNAL_INSERT, dict(values))


def idempotency_key_claim(
    session: Session, namespace: str, key: str, signal_id: str, ttl_hours: float
) -> bool:
    """Bind `key` to `signal_id` unless a live binding exists. True if bound.

    The primary key makes concurrent identical creates serialise here: the
    losers wait for the winner's commit, then see a live key and get False.
    """
    bound = session.execute(
        text(
            """
            INSERT INTO idempotency_keys (namespace, key, signal_id, expires_at)
            VALUES (:ns, :key, :sid, now() + make_interval(secs => :ttl))
            ON CONFLICT (namespace, key) DO UPDATE
                SET signal_id = EXCLUDED.signal_id, expires_at = EXCLUDED.expires_at
                WHERE idempotency_keys.expires_at <= now()
            RETURNING signal_id
            """
        ),
        {"ns": namespace, "key": key, "sid": signal_id, "ttl": ttl_hours * 3600.0},
    ).scalar_one_or_none()
    return bound == signal_id


def idempotency_key_signal(session: Session, namespace: str, key: str) -> str | None:
    return session.execute(
        text(
            "SELECT signal_id FROM idempotency_keys"
            " WHERE namespace = :ns AND key = :key AND expires_at > now()"
        ),
        {"ns": namespace, "key": key},
    ).scalar_one_or_none()


def signal_get(session: Session, signal_id: str, namespace: str | None = None) -> Row | None:
    sql = "SELECT * FROM signals WHERE id = :id"
    if namespace is not None:
        sql += " AND namespace = :ns"
    return session.execute(text(sql), {"id": signal_id, "ns": namespace}).mappings().first()


def signal_waiting_count(
    session: Session, namespace: str, *, limit: int, serialise: bool = False
) -> int:
    """How many of the namespace's signals are waiting, counted up to `limit`
    (a bounded count: its cost does not grow past the limit).

    `serialise` first takes a transaction-scoped advisory lock on the
    namespace, so concurrent creates near the quota count one after another
    and each sees the others' committed rows.
    """
    if serialise:
        session.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended('signalbox.waiting:' || :ns, 0))"),
            {"ns": namespace},
        )
    return int(
        session.execute(
            text(
                "SELECT count(*) FROM (SELECT 1 FROM signals"
                " WHERE namespace = :ns AND status = 'waiting' LIMIT :limit) AS w"
            ),
            {"ns": namespace, "limit": limit},
        ).scalar_one()
    )


def signal_rows_many(session: Session, signal_ids: Sequence[str]) -> list[Row]:
    return list(
        session.execute(
            text("SELECT * FROM signals WHERE id = ANY(:ids) ORDER BY created_at, id"),
            {"ids": list(signal_ids)},
        )
        .mappings()
        .all()
    )


def signal_list_by_run(
    session: Session,
    namespace: str | None,
    run_id: str,
    *,
    after: tuple[datetime, str] | None,
    limit: int,
) -> Sequence[Row]:
    """The run's signals in one namespace, or in every one (`namespace` None)."""
    params: dict[str, Any] = {"ns": namespace, "run": run_id, "limit": limit}
    cursor_sql = ""
    ns_sql = "namespace = :ns AND " if namespace is not None else ""
    if after is not None:
        cursor_sql = " AND (created_at, id) > (:after_ts, :after_id)"
        params.update(after_ts=after[0], after_id=after[1])
    return (
        session.execute(
            text(
                "SELECT * FROM signals WHERE "
                + ns_sql
                + "run_id = :run"
                + cursor_sql
                + " ORDER BY created_at, id LIMIT :limit"
            ),
            params,
        )
        .mappings()
        .all()
    )


def signal_ids_by_run(session: Session, namespace: str, run_id: str) -> list[str]:
    return list(
        session.execute(
            text(
                "SELECT id FROM signals WHERE namespace = :ns AND run_id = :run"
                " ORDER BY created_at, id"
            ),
            {"ns": namespace, "run": run_id},
        ).scalars()
    )


def signal_lock_for_check(
    session: Session,
    signal_id: str,
    *,
    lease_seconds: float,
    batch_limit: int,
    coalesce_seconds: float = 0.0,
) -> list[Row]:
    """Take `signal_id` and the other due signals of its provider for one check.

    Signals due within `coalesce_seconds` ride along: one provider call then
    answers them all instead of one call each a moment apart. Rows already
    locked or under another check's lease are skipped. Each taken row gets a
    new fence and a lease; the caller commits at once and calls the provider
    with no lock held.
    """
    return list(
        session.execute(
            text(
                """
                WITH target AS (
                    SELECT provider FROM signals WHERE id = :id
                ), due AS (
                    SELECT s.id FROM signals s, target t
                    WHERE s.status = 'waiting'
                      AND s.provider = t.provider
                      AND s.next_check_at <= now() + make_interval(secs => :window)
                      AND (s.check_lease_until IS NULL OR s.check_lease_until < now())
                    ORDER BY (s.id = :id) DESC, s.next_check_at
                    LIMIT :limit
                    FOR UPDATE OF s SKIP LOCKED
                )
                UPDATE signals s
                   SET check_fence = s.check_fence + 1,
                       check_lease_until = now() + make_interval(secs => :lease),
                       updated_at = now()
                  FROM due WHERE s.id = due.id
                RETURNING s.*
                """
            ),
            {
                "id": signal_id,
                "lease": lease_seconds,
                "limit": batch_limit,
                "window": coalesce_seconds,
            },
        )
        .mappings()
        .all()
    )


def signal_lock_fenced(session: Session, signal_id: str, fence: int) -> Row | None:
    """Re-take a signal for writing a check's result, if the fence still holds."""
    return (
        session.execute(
            text(
                "SELECT * FROM signals WHERE id = :id AND check_fence = :fence"
                " AND status = 'waiting' FOR UPDATE"
            ),
            {"id": signal_id, "fence": fence},
        )
        .mappings()
        .first()
    )


def signal_record_check(
    session: Session,
    signal_id: str,
    fence: int,
    *,
    outcome: str,
    error_code: str | None,
    counts: bool,
    consecutive_errors: int,
    next_check_at: datetime | None,
    next_check_reason: str,
    started_at: datetime,
) -> tuple[bool, bool]:
    """Write a check's effect on the signal, guarded by the fence.

    Returns (written, pushed): `pushed` says a push arrived while the check
    ran (it stamped `enqueued_at` after `started_at`); the push is kept
    (due now, reason `push`) instead of being overwritten by the backoff,
    and the caller must send the task again.
    """
    row = session.execute(
        text(
            """
            UPDATE signals
               SET checks_count = checks_count + :inc,
                   consecutive_errors = :errors,
                   last_check_at = now(),
                   last_outcome = :outcome,
                   last_error_code = :error_code,
                   next_check_at = CASE WHEN enqueued_at > :started THEN now() ELSE :next_at END,
                   next_check_reason = CASE WHEN enqueued_at > :started THEN 'push'
                                            ELSE :next_reason END,
                   check_lease_until = NULL,
                   updated_at = now()
             WHERE id = :id AND check_fence = :fence AND status = 'waiting'
            RETURNING coalesce(enqueued_at > :started, false)
            """
        ),
        {
            "id": signal_id,
            "fence": fence,
            "inc": 1 if counts else 0,
            "errors": consecutive_errors,
            "outcome": outcome,
            "error_code": error_code,
            "next_at": next_check_at,
            "next_reason": next_check_reason,
            "started": started_at,
        },
    ).first()
    return (row is not None, bool(row[0]) if row is not None else False)


def signal_mark_found(session: Session, signal_id: str, fence: int, message_id: str) -> bool:
    """waiting → found with `message_id`. The unique index on signals.message_id
    raises IntegrityError if another signal took the message first."""
    return (
        affected(
            session.execute(
                text(
                    """
                UPDATE signals
                   SET status = 'found', message_id = :mid, found_at = now(),
                       checks_count = checks_count + 1, consecutive_errors = 0,
                       last_check_at = now(), last_outcome = 'matched',
                       last_error_code = NULL, next_check_at = NULL,
                       check_lease_until = NULL, updated_at = now()
                 WHERE id = :id AND check_fence = :fence AND status = 'waiting'
                """
                ),
                {"id": signal_id, "fence": fence, "mid": message_id},
            )
        )
        == 1
    )


def signal_expire(
    session: Session, signal_id: str, *, expected: str, reason: str, fence: int | None = None
) -> Row | None:
    """`expected` → expired with `reason`; returns the row, or None if it moved."""
    sql = """
        UPDATE signals
           SET status = 'expired', expiry_reason = :reason, expired_at = now(),
               next_check_at = NULL, check_lease_until = NULL, updated_at = now()
         WHERE id = :id AND status = :expected
    """
    if fence is not None:
        sql += " AND check_fence = :fence"
    return (
        session.execute(
            text(sql + " RETURNING *"),
            {"id": signal_id, "expected": expected, "reason": reason, "fence": fence},
        )
        .mappings()
        .first()
    )


def signal_ids_past_deadline(session: Session, limit: int) -> list[str]:
    """Waiting signals past their deadline and not under a live check lease."""
    return list(
        session.execute(
            text(
                """
                SELECT id FROM signals
                 WHERE status = 'waiting' AND expires_at <= now()
                   AND (check_lease_until IS NULL OR check_lease_until < now())
                 ORDER BY expires_at
                 LIMIT :limit
                 FOR UPDATE SKIP LOCKED
                """
            ),
            {"limit": limit},
        ).scalars()
    )


def signal_mark_due_enqueued(
    session: Session, *, requeue_after_seconds: float, limit: int
) -> list[tuple[str, str]]:
    """Stamp and return the due signals that need a task sent.

    A signal needs one when its next check is due and no task was sent for
    it since, or when the last task sent was not taken within
    `requeue_after_seconds` (lost: broker restart, worker killed); those are
    re-sent with reason `sweep`.
    """
    rows = session.execute(
        text(
            """
            WITH due AS (
                SELECT id FROM signals
                 WHERE status = 'waiting' AND next_check_at <= now()
                   AND expires_at > now()
                   AND (check_lease_until IS NULL OR check_lease_until < now())
                   AND (enqueued_at IS NULL OR enqueued_at < next_check_at
                        OR enqueued_at < now() - make_interval(secs => :requeue))
                 ORDER BY next_check_at
                 LIMIT :limit
                 FOR UPDATE SKIP LOCKED
            )
            UPDATE signals s
               SET next_check_reason = CASE
                       WHEN s.enqueued_at IS NOT NULL AND s.enqueued_at >= s.next_check_at
                       THEN 'sweep' ELSE s.next_check_reason END,
                   enqueued_at = now()
              FROM due WHERE s.id = due.id
            RETURNING s.id, s.next_check_reason
            """
        ),
        {"requeue": requeue_after_seconds, "limit": limit},
    ).all()
    return [(r[0], r[1]) for r in rows]


def signal_push_due(
    session: Session,
    provider: str,
    recipients: Iterable[str] | None,
    namespace: str | None = None,
) -> list[str]:
    """Make waiting signals of `provider` (optionally only those for
    `recipients`, or of one namespace) due now with reason `push`; return
    their ids to enqueue."""
    params: dict[str, Any] = {"provider": provider, "ns": namespace}
    where = " AND namespace = :ns" if namespace is not None else ""
    if recipients is not None:
        params["rcpts"] = sorted({r.lower() for r in recipients})
        where += " AND recipient = ANY(:rcpts)"
    # Rows are locked in (created_at, id) order, the order a check's second
    # transaction locks them in: two multi-row lockers in one order cannot
    # deadlock each other.
    return list(
        session.execute(
            text(
                """
                WITH pushed AS (
                    SELECT id FROM signals
                     WHERE status = 'waiting' AND provider = :provider"""
                + where
                + """
                     ORDER BY created_at, id
                     FOR UPDATE
                )
                UPDATE signals s
                   SET next_check_at = clock_timestamp(), next_check_reason = 'push',
                       -- clock_timestamp(): stamped after any check's lock is
                       -- released, so a check in flight sees the push as newer.
                       enqueued_at = clock_timestamp()
                  FROM pushed WHERE s.id = pushed.id
                RETURNING s.id
                """
            ),
            params,
        ).scalars()
    )


def signal_oldest_due_age(session: Session) -> float:
    age = session.execute(
        text(
            "SELECT extract(epoch FROM now() - min(next_check_at)) FROM signals"
            " WHERE status = 'waiting' AND next_check_at <= now()"
        )
    ).scalar_one_or_none()
    return float(age or 0.0)


def signal_count_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(text("SELECT status, count(*) FROM signals GROUP BY status")).all()
    return {r[0]: int(r[1]) for r in rows}


def signal_redrive(
    session: Session, signal_id: str, *, expires_in: float, max_checks: int
) -> Row | None:
    """expired → waiting, with a new deadline and budget; history stays."""
    return (
        session.execute(
            text(
                """
                UPDATE signals
                   SET status = 'waiting', expiry_reason = NULL, expired_at = NULL,
                       generation = generation + 1,
                       expires_at = now() + make_interval(secs => :exp),
                       max_checks = checks_count + :max_checks,
                       consecutive_errors = 0, claims_used = 0,
                       next_check_at = now(), next_check_reason = 'redrive',
                       enqueued_at = now(), check_lease_until = NULL,
                       last_outcome = NULL, last_error_code = NULL,
                       updated_at = now()
                 WHERE id = :id AND status = 'expired'
                 RETURNING *
                """
            ),
            {"id": signal_id, "exp": expires_in, "max_checks": max_checks},
        )
        .mappings()
        .first()
    )


# ---------------------------------------------------------------- checks


def check_insert(
    session: Session,
    *,
    signal_id: str,
    generation: int,
    fence: int,
    provider: str,
    reason: str,
    outcome: str,
    error_code: str | None,
    batch_id: str | None,
    started_at: datetime,
) -> bool:
    """Record one check; a second write for the same fence is a no-op."""
    return (
        affected(
            session.execute(
                text(
                    """
                INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,
                                    error_code, batch_id, started_at)
                VALUES (:sid, :gen, :fence, :provider, :reason, :outcome, :err, :batch, :started)
                ON CONFLICT (signal_id, fence) DO NOTHING
                """
                ),
                {
                    "sid": signal_id,
                    "gen": generation,
                    "fence": fence,
                    "provider": provider,
                    "reason": reason,
                    "outcome": outcome,
                    "err": error_code,
                    "batch": batch_id,
                    "started": started_at,
                },
            )
        )
        == 1
    )


def check_counts_by_outcome(
    session: Session, signal_ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    rows = session.execute(
        text(
            "SELECT signal_id, outcome, count(*) FROM checks WHERE signal_id = ANY(:ids)"
            " GROUP BY signal_id, outcome"
        ),
        {"ids": list(signal_ids)},
    ).all()
    out: dict[str, dict[str, int]] = {}
    for sid, outcome, n in rows:
        out.setdefault(sid, {})[outcome] = int(n)
    return out
