"""The repository: every SQL statement of signals, messages, checks and the sink.

Functions are named noun first, then verb. State changes are guarded
(`WHERE id = :id AND status = :expected [AND fence = :fence]`); zero rows back
means someone else moved first, which is a normal outcome (None / False).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from app.db import raw
from app.domain.states import FIND, REDRIVE, Status, transition

# What a repository function returns for a row: a RowMapping, or a dict from raw.
Row = Mapping[Any, Any]


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


@dataclass(frozen=True)
class CreateFacts:
    """What a create must know before it inserts, read in one statement."""

    now: datetime
    mailbox_owner: str | None
    waiting: int


# A create's facts (the one-statement create reads them too): the clock, the
# owner of `:address`'s mailbox and `:namespace`'s trigger-kept waiting count.
_CREATE_FACTS = """
    SELECT clock_timestamp() AS now,
           (SELECT namespace FROM mailboxes WHERE address = :address) AS mailbox_owner,
           (SELECT coalesce(sum(waiting), 0) FROM namespace_waiting
             WHERE namespace = :namespace) AS waiting
"""


def signal_create_facts(session: Session, namespace: str, address: str) -> CreateFacts:
    """The database's clock, the namespace owning `address`'s mailbox (live or
    deleted; None) and how many of the namespace's signals are waiting (the
    trigger-kept count of `namespace_waiting`: no scan)."""
    row = session.execute(
        text(_CREATE_FACTS), {"address": address.strip().lower(), "namespace": namespace}
    ).one()
    return CreateFacts(now=row.now, mailbox_owner=row.mailbox_owner, waiting=int(row.waiting))


# What a view needs beside the signal's row (see signal_view_get): the
# database clock and the summary of its message (joined as `m`) ...
_VIEW_COLUMNS = """
    clock_timestamp() AS view_now,
    m.id AS view_message_id, m.received_at AS view_message_received_at,
    m.subject AS view_message_subject, m.run_marker AS view_message_run_marker
"""
# ... and the same columns for a signal that has no message yet.
_NEW_VIEW_COLUMNS = """
    clock_timestamp() AS view_now, NULL::text AS view_message_id,
    NULL::timestamptz AS view_message_received_at, NULL::text AS view_message_subject,
    NULL::text AS view_message_run_marker
"""

# The idempotency key, bound to the new signal unless a live binding exists.
_BIND_KEY = """
    INSERT INTO idempotency_keys (namespace, key, signal_id, expires_at)
    {source}
    ON CONFLICT (namespace, key) DO UPDATE
        SET signal_id = EXCLUDED.signal_id, expires_at = EXCLUDED.expires_at
        WHERE idempotency_keys.expires_at <= now()
    RETURNING signal_id
"""
# The new signal, inserted when the key was bound to it; `{now}` is the clock.
_INSERT_SIGNAL = """
    INSERT INTO signals (
        id, namespace, idempotency_key, run_id, test_case, recipient,
        subject_contains, body_contains, received_after, created_at, updated_at,
        expires_at, max_checks, provider, require_run_marker, metadata,
        status, next_check_at, next_check_reason, enqueued_at, max_claims)
    SELECT
        :id, :namespace, :idempotency_key, :run_id, :test_case, :recipient,
        :subject_contains, :body_contains, coalesce(:received_after, {now}), {now}, {now},
        {now} + make_interval(secs => :expires_in), :max_checks, :provider,
        :require_run_marker, :metadata,
        'waiting', {now}, 'first', {now}, :max_claims
    {source}
    WHERE EXISTS (SELECT 1 FROM key WHERE signal_id = :id)
"""

_SIGNAL_CREATE = text(
    f"""
    WITH key AS (
        {
        _BIND_KEY.format(
            source="VALUES (:namespace, :idempotency_key, :id, now() + make_interval(secs => :ttl))"
        )
    }
    )
    {_INSERT_SIGNAL.format(now=":now", source="")}
    RETURNING *, {_NEW_VIEW_COLUMNS}
    """
).bindparams(bindparam("metadata", type_=JSONB))


def signal_create(session: Session, values: Mapping[Any, Any], ttl_hours: float) -> Row | None:
    """Bind the idempotency key to a new signal and insert it, in one
    statement; the new row (with signal_view_get's columns), or None when a
    live binding of the key exists (nothing is inserted then).

    The key's primary key makes concurrent identical creates serialise: the
    losers wait for the winner's commit, then see a live key and insert
    nothing. The key's foreign key is checked at the end of the statement,
    when the signal exists."""
    return session.execute(_SIGNAL_CREATE, {**values, "ttl": ttl_hours * 3600.0}).mappings().first()


# The common create, decided in the statement: the facts of
# signal_create_facts, and the insert only when they clear every check by a
# margin (the caller's checks, made in a transaction, decide the rest). One
# row always: the created signal's, or NULLs.
_SIGNAL_CREATE_CLEAR = raw.Query(
    f"""
    WITH facts AS ({_CREATE_FACTS}), clear AS (
        SELECT now FROM facts
         WHERE waiting < :clear_below
           AND coalesce(mailbox_owner, CAST(:domain_owner AS text), :namespace) = :namespace
           AND coalesce(
                 CAST(:received_after AS timestamptz)
                   BETWEEN now - make_interval(secs => :lookback_seconds - 1)
                       AND now + make_interval(secs => :lookahead_seconds - 1),
                 true)
    ), key AS (
        {
        _BIND_KEY.format(
            source="SELECT :namespace, :idempotency_key, :id,"
            " now() + make_interval(secs => :ttl) FROM clear"
        )
    }
    ), created AS (
        {_INSERT_SIGNAL.format(now="clear.now", source="FROM clear")}
        RETURNING *
    )
    SELECT c.*, {_NEW_VIEW_COLUMNS} FROM facts LEFT JOIN created c ON true
    """
)


def signal_create_if_clear(
    session: Session,
    values: Mapping[Any, Any],
    ttl_hours: float,
    *,
    domain_owner: str | None,
    clear_below: int,
    lookback_hours: float,
    lookahead_hours: float,
) -> Row | None:
    """A create in one statement, when it is clear: the namespace has fewer
    than `clear_below` waiting signals, may use the address (its mailbox's
    owner, else `domain_owner`, is None or the namespace), `received_after`
    is None or a second inside the lookback and lookahead, and the key has
    no live binding. The new row with signal_view_get's columns, or None
    when nothing was inserted: the caller then decides, in a transaction."""
    row = raw.row(
        session,
        _SIGNAL_CREATE_CLEAR,
        {
            **values,
            "metadata": Jsonb(values["metadata"]),
            "address": str(values["recipient"]).strip().lower(),
            "domain_owner": domain_owner,
            "clear_below": clear_below,
            "lookback_seconds": lookback_hours * 3600.0,
            "lookahead_seconds": lookahead_hours * 3600.0,
            "ttl": ttl_hours * 3600.0,
        },
    )
    return row if row is not None and row["id"] is not None else None


def signal_view_by_key(session: Session, namespace: str, key: str) -> Row | None:
    """The signal a live idempotency key names, with signal_view_get's columns."""
    sql = f"""
        SELECT s.*, {_VIEW_COLUMNS}
          FROM idempotency_keys k
          JOIN signals s ON s.id = k.signal_id
          LEFT JOIN messages m ON m.id = s.message_id
         WHERE k.namespace = :ns AND k.key = :key AND k.expires_at > now()
    """
    return session.execute(text(sql), {"ns": namespace, "key": key}).mappings().first()


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


_VIEW_GET = raw.Query(
    f"""
    SELECT s.*, {_VIEW_COLUMNS}
      FROM signals s LEFT JOIN messages m ON m.id = s.message_id
     WHERE s.id = :id
    """
)
_VIEW_GET_IN = raw.Query(_VIEW_GET.sql + " AND s.namespace = :ns")


def signal_view_get(session: Session, signal_id: str, namespace: str | None = None) -> Row | None:
    """A signal and what its view needs, in one statement: the row, the
    database clock (`view_now`) and its message's summary (`view_message_id`,
    `_received_at`, `_subject`, `_run_marker`; NULL before a match).
    `views.signal_views` then asks nothing more for a waiting or found signal.
    """
    if namespace is None:
        return raw.row(session, _VIEW_GET, {"id": signal_id})
    return raw.row(session, _VIEW_GET_IN, {"id": signal_id, "ns": namespace})


def signal_waiting_count(session: Session, namespace: str, *, serialise: bool = False) -> int:
    """How many of the namespace's signals are waiting: the sum of its rows
    in `namespace_waiting`, which a trigger on `signals` keeps (no scan).

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
            text("SELECT coalesce(sum(waiting), 0) FROM namespace_waiting WHERE namespace = :ns"),
            {"ns": namespace},
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


_LOCK_FOR_CHECK = raw.Query(
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
                RETURNING s.*, now() AS looked_at
"""
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
    with no lock held. Each row carries `looked_at`, the server's now.
    """
    return raw.rows(
        session,
        _LOCK_FOR_CHECK,
        {"id": signal_id, "lease": lease_seconds, "limit": batch_limit, "window": coalesce_seconds},
    )


def signal_extend_check_leases(
    session: Session, fences: Sequence[tuple[str, int]], lease_seconds: float
) -> int:
    """Heartbeat: push the check lease of each (signal, fence) still held."""
    if not fences:
        return 0
    return affected(
        session.execute(
            text(
                """
                UPDATE signals s
                   SET check_lease_until = now() + make_interval(secs => :lease)
                  FROM unnest(CAST(:ids AS text[]), CAST(:fences AS bigint[])) AS f(id, fence)
                 WHERE s.id = f.id AND s.check_fence = f.fence AND s.status = 'waiting'
                """
            ),
            {
                "ids": [i for i, _ in fences],
                "fences": [f for _, f in fences],
                "lease": lease_seconds,
            },
        )
    )


@dataclass(frozen=True)
class CheckRecord:
    """The check row a check's write adds beside the signal's update."""

    reason: str
    outcome: str
    error_code: str | None
    batch_id: str | None
    started_at: datetime
    counted: bool
    messages_seen: int | None = None

    def params(self) -> dict[str, Any]:
        return {
            "c_seen": self.messages_seen,
            "c_reason": self.reason,
            "c_outcome": self.outcome,
            "c_error": self.error_code,
            "c_batch": self.batch_id,
            "c_started": self.started_at,
            "c_counted": self.counted,
        }


# Appended to a fenced `UPDATE signals … RETURNING id, generation, provider`
# named `upd`: the check row is written by the same statement, and only when
# the fence held (one row per fence: a second write is a no-op).
_CHECK_ROW = """
    , chk AS (
        INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,
                            error_code, batch_id, started_at, counted, messages_seen)
        SELECT upd.id, upd.generation, :fence, upd.provider, :c_reason, :c_outcome,
               :c_error, :c_batch, :c_started, :c_counted, :c_seen
          FROM upd
        ON CONFLICT (signal_id, fence) DO NOTHING
    )
"""


_RECORD_CHECK = raw.Query(
    """
            WITH upd AS (
                UPDATE signals
                   SET checks_count = checks_count + :inc,
                       consecutive_errors = :errors,
                       last_check_at = now(),
                       -- A check that made no call (breaker open, provider
                       -- busy) is no look: expiry still waits for one.
                       last_look_at = CASE WHEN :c_outcome = 'circuit_open' THEN last_look_at
                                           ELSE :c_started END,
                       last_outcome = :c_outcome,
                       last_error_code = :c_error,
                       next_check_at = CASE WHEN enqueued_at > :c_started THEN now()
                                            ELSE :next_at END,
                       next_check_reason = CASE WHEN enqueued_at > :c_started THEN 'push'
                                                ELSE :next_reason END,
                       check_lease_until = NULL,
                       updated_at = now()
                 WHERE id = :id AND check_fence = :fence AND status = 'waiting'
                RETURNING id, generation, provider,
                          coalesce(enqueued_at > :c_started, false) AS pushed
            )"""
    + _CHECK_ROW
    + "SELECT pushed FROM upd"
)


def signal_record_check(
    session: Session,
    signal_id: str,
    fence: int,
    check: CheckRecord,
    *,
    consecutive_errors: int,
    next_check_at: datetime | None,
    next_check_reason: str,
) -> tuple[bool, bool]:
    """Write a check that found nothing (its row and its effect on the
    signal) in one statement, guarded by the fence.

    Returns (written, pushed): `pushed` says a push arrived while the check
    ran (it stamped `enqueued_at` after the check began); the push is kept
    (due now, reason `push`) instead of being overwritten by the backoff,
    and the caller must send the task again.
    """
    row = raw.row(
        session,
        _RECORD_CHECK,
        {
            **check.params(),
            "id": signal_id,
            "fence": fence,
            "inc": 1 if check.counted else 0,
            "errors": consecutive_errors,
            "next_at": next_check_at,
            "next_reason": next_check_reason,
        },
    )
    return (row is not None, bool(row["pushed"]) if row is not None else False)


_MARK_FOUND = raw.Query(
    """
            WITH upd AS (
                UPDATE signals
                   SET status = :dst, message_id = :mid, found_at = now(),
                       checks_count = checks_count + :inc, consecutive_errors = 0,
                       last_check_at = now(), last_look_at = :c_started,
                       last_outcome = 'matched', last_error_code = NULL, next_check_at = NULL,
                       check_lease_until = NULL, updated_at = now()
                 WHERE id = :id AND check_fence = :fence AND status = :src
                RETURNING id, generation, provider
            )"""
    + _CHECK_ROW
    + "SELECT count(*) AS n FROM upd"
)


def signal_mark_found(
    session: Session, signal_id: str, fence: int, message_id: str, check: CheckRecord
) -> bool:
    """waiting → found with `message_id`, and the matched check's row, in one
    statement guarded by the fence. The unique index on (namespace,
    message_id) raises IntegrityError if another signal of the namespace
    took the message first."""
    row = raw.row(
        session,
        _MARK_FOUND,
        {
            **check.params(),
            **FIND.params,
            "id": signal_id,
            "fence": fence,
            "mid": message_id,
            "inc": 1 if check.counted else 0,
        },
    )
    return row is not None and int(row["n"]) == 1


def signal_expire(
    session: Session, signal_id: str, *, expected: str, reason: str, fence: int | None = None
) -> Row | None:
    """`expected` → expired with `reason`; returns the row, or None if it moved."""
    sql = """
        UPDATE signals
           SET status = :dst, expiry_reason = :reason, expired_at = now(),
               next_check_at = NULL, check_lease_until = NULL, updated_at = now()
         WHERE id = :id AND status = :src
    """
    if fence is not None:
        sql += " AND check_fence = :fence"
    return (
        session.execute(
            text(sql + " RETURNING *"),
            {
                **transition(Status(expected), Status.EXPIRED).params,
                "id": signal_id,
                "reason": reason,
                "fence": fence,
            },
        )
        .mappings()
        .first()
    )


# How many graces a signal whose final look never began waits (no worker took
# its task: a saturated pool, workers down) before it expires unseen.
UNLOOKED_GRACES = 4


def signal_ids_past_deadline(session: Session, limit: int, grace_seconds: float) -> list[str]:
    """Waiting signals past their deadline, not under a live check lease, that
    can expire now: their final look saw the provider (a check began at or
    after the deadline and found nothing); or their final looks failed for
    `grace_seconds` after the deadline (the provider kept failing); or no
    final look began in UNLOOKED_GRACES graces (no worker took it).

    A signal whose final look has not begun yet is not given up after one
    grace: mail held before the deadline must not be lost because every
    worker was busy with a slow provider."""
    return list(
        session.execute(
            text(
                """
                SELECT id FROM signals
                 WHERE status = 'waiting' AND expires_at <= now()
                   AND (last_look_at >= expires_at
                            AND (last_outcome = 'no_match'
                                 OR expires_at <= now() - make_interval(secs => :grace))
                        OR expires_at <= now() - make_interval(secs => :unlooked))
                   AND (check_lease_until IS NULL OR check_lease_until < now())
                 ORDER BY expires_at
                 LIMIT :limit
                 FOR UPDATE SKIP LOCKED
                """
            ),
            {"limit": limit, "grace": grace_seconds, "unlooked": grace_seconds * UNLOOKED_GRACES},
        ).scalars()
    )


def signal_mark_due_enqueued(
    session: Session,
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
    rows = session.execute(
        text(
            """
            WITH due AS (
                SELECT id FROM signals
                 WHERE status = 'waiting' AND next_check_at <= now()
                   AND (check_lease_until IS NULL OR check_lease_until < now())
                   AND (enqueued_at IS NULL OR enqueued_at < next_check_at
                        OR enqueued_at < now() - make_interval(secs => CASE
                               WHEN provider = ANY(:looked_here) THEN :requeue_here
                               ELSE :requeue END))
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
            RETURNING s.id, s.next_check_reason, s.provider
            """
        ),
        {
            "requeue": requeue_after_seconds * (1 if resend_lost else 10),
            "requeue_here": requeue_after_seconds,
            "looked_here": list(looked_here),
            "limit": limit,
        },
    ).all()
    return [(r[0], r[1], r[2]) for r in rows]


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
    session: Session,
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
    params: dict[str, Any] = {"provider": provider, "ns": namespace, "limit": limit}
    where = " AND namespace = :ns" if namespace is not None else ""
    if after is not None:
        where += " AND (created_at, id) > (:after_ts, :after_id)"
        params.update(after_ts=after[0], after_id=after[1])
    if recipients is not None:
        params["rcpts"] = sorted({r.lower() for r in recipients})
        where += " AND recipient = ANY(:rcpts)"
    # Rows are locked in (created_at, id) order, the order a check's second
    # transaction locks them in: two multi-row lockers in one order cannot
    # deadlock each other.
    rows = raw.rows(session, raw.query(_PUSH_DUE_HEAD + where + _PUSH_DUE_TAIL), params)
    return [(r["id"], r["created_at"]) for r in rows]


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
                   SET status = :dst, expiry_reason = NULL, expired_at = NULL,
                       generation = generation + 1,
                       -- A check still in flight for the old generation is fenced out.
                       check_fence = check_fence + 1, last_look_at = NULL,
                       expires_at = now() + make_interval(secs => :exp),
                       max_checks = checks_count + :max_checks,
                       consecutive_errors = 0, claims_used = 0,
                       next_check_at = now(), next_check_reason = 'redrive',
                       enqueued_at = now(), check_lease_until = NULL,
                       last_outcome = NULL, last_error_code = NULL,
                       updated_at = now()
                 WHERE id = :id AND status = :src
                 RETURNING *
                """
            ),
            {"id": signal_id, "exp": expires_in, "max_checks": max_checks, **REDRIVE.params},
        )
        .mappings()
        .first()
    )


# ---------------------------------------------------------------- checks


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
