"""Repository of signals (`signals`, with `idempotency_keys`): create, read,
list, expire, redrive and count.

A create binds its idempotency key and inserts the signal in one statement.
State changes are guarded (`WHERE id = :id AND status = :src`); zero rows
back means someone else moved first, which is a normal outcome (None). The
check protocol's writes are in `checks`, the sweep's due work in `due`, the
claim's in `claims`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import Connection, DateTime

from app.db import runner
from app.db.create_look import LOOK_CHECK, LOOK_MAIL, FirstLook, looked
from app.db.models import Signal
from app.db.pagination import BY_CREATION
from app.db.records import SignalRow
from app.db.runner import Statement
from app.domain.states import REDRIVE, Status, transition

# A create's facts: the clock, the owner of `:address`'s mailbox,
# `:namespace`'s trigger-kept waiting count and the namespace holding the
# address (its open hold; `{lock}` FOR SHARE, so that another namespace cannot
# take it over while the create commits).
_CREATE_FACTS_OF = """
    SELECT clock_timestamp() AS now,
           (SELECT namespace FROM mailboxes WHERE address = :address) AS mailbox_owner,
           (SELECT coalesce(sum(waiting), 0) FROM namespace_waiting
             WHERE namespace = :namespace) AS waiting,
           h.namespace AS holder
      FROM (SELECT 1) AS one
      LEFT JOIN LATERAL (SELECT namespace FROM address_holds
                          WHERE address = :address AND released_at IS NULL
                          {lock}) AS h ON true
"""
# What a view needs beside the signal's row (see signal_view_get): the
# database clock and the summary of its message (joined as `m`) ...
_VIEW_COLUMNS = """
    clock_timestamp() AS view_now,
    m.id AS view_message_id, m.received_at AS view_message_received_at,
    m.subject AS view_message_subject, m.run_marker AS view_message_run_marker,
    m.bare_lf AS view_message_bare_lf
"""
# ... and the same columns for a signal that has no message yet.
_NEW_VIEW_COLUMNS = """
    clock_timestamp() AS view_now, NULL::text AS view_message_id,
    NULL::timestamptz AS view_message_received_at, NULL::text AS view_message_subject,
    NULL::text AS view_message_run_marker, NULL::boolean AS view_message_bare_lf
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
# Columns a create may leave out (a signal expecting the first match).
# `first_check_in`: seconds to the first check (domain.scheduling.first_check_delay).
_DEFAULTS = {"expect": "first", "settle_seconds": None, "first_check_in": 0.0}

# The new signal, inserted when the key was bound to it (`insert_signal`).
_INSERT_SIGNAL = """
    INSERT INTO signals (
        id, namespace, idempotency_key, run_id, test_case, recipient,
        subject_contains, body_contains, received_after, created_at, updated_at,
        expires_at, max_checks, provider, require_run_marker, metadata,
        status, next_check_at, next_check_reason, enqueued_at, max_claims,
        expect, settle_seconds{looked_columns})
    SELECT
        :id, :namespace, :idempotency_key, :run_id, :test_case, :recipient,
        :subject_contains, :body_contains, coalesce(:received_after, {now}), {now}, {now},
        {now} + make_interval(secs => :expires_in), :max_checks, :provider,
        :require_run_marker, :metadata,
        'waiting', {due}, {reason}, {now}, :max_claims,
        :expect, CAST(:settle_seconds AS smallint){looked_values}
    {source}
    WHERE EXISTS (SELECT 1 FROM key WHERE signal_id = :id)
"""


def insert_signal(now: str, source: str, *, look: bool = False) -> str:
    """The insert of a new signal at the clock `now` from `source`; with
    `look`, as the create's first look leaves it when it found nothing."""
    due = f"{now} + make_interval(secs => :first_check_in)"
    if look:
        return _INSERT_SIGNAL.format(now=now, source=f"{source}, looked", **looked(now, due))
    return _INSERT_SIGNAL.format(
        now=now, source=source, due=due, reason="'first'", looked_columns="", looked_values=""
    )


_SIGNAL_CREATE: Statement = Statement(
    "signal_create",
    f"""
    WITH key AS (
        {
        _BIND_KEY.format(
            source="VALUES (:namespace, :idempotency_key, :id, now() + make_interval(secs => :ttl))"
        )
    }
    )
    {insert_signal(":now", "")}
    RETURNING *, {_NEW_VIEW_COLUMNS}
    """,
)


def signal_create(
    session: Connection, values: Mapping[Any, Any], ttl_hours: float
) -> dict[str, Any] | None:
    """Bind the idempotency key to a new signal and insert it, in one
    statement; the new row (with signal_view_get's columns), or None when a
    live binding of the key exists (nothing is inserted then).

    The key's primary key makes concurrent identical creates serialise: the
    losers wait for the winner's commit, then see a live key and insert
    nothing. The key's foreign key is checked at the end of the statement,
    when the signal exists."""
    params = {
        **_DEFAULTS,
        **values,
        "metadata": Jsonb(values["metadata"]),
        "ttl": ttl_hours * 3600.0,
    }
    return runner.one(session, _SIGNAL_CREATE, params)


# The create, decided in the statement: the facts of signal_create_facts, the
# statement's verdicts on them (`fact_*`), and the insert only when they clear
# every check (`app.domain.admission` says why when they do not). One row
# always: the facts, with the created signal's columns, or NULLs.
def _create_clear_sql(*, look: bool) -> str:
    return f"""
    WITH seen AS ({_CREATE_FACTS_OF.format(lock="FOR SHARE")}), facts AS (
        SELECT now, mailbox_owner, holder, waiting,
               coalesce(
                 CAST(:received_after AS timestamptz)
                   BETWEEN now - make_interval(secs => :lookback_seconds)
                       AND now + make_interval(secs => :lookahead_seconds),
                 true) AS in_window,
               coalesce(mailbox_owner, CAST(:domain_owner AS text), :namespace)
                 = :namespace AS owner_ok,
               waiting < :clear_below AS under_bound,
               (SELECT k.signal_id FROM idempotency_keys k
                 WHERE k.namespace = :namespace AND k.key = :idempotency_key
                   AND k.expires_at > now()) AS key_signal
          FROM seen
    ), base AS (
        SELECT now, mailbox_owner, holder FROM facts
         WHERE in_window AND owner_ok AND under_bound
    ), held AS (
        -- Only a create that can bind its key takes a hold: a live binding
        -- means a replay (200) or a conflict (409), and neither keeps one.
        INSERT INTO address_holds (address, namespace, held_from)
        SELECT :address, :namespace, now FROM base
         WHERE CAST(:holdable AS boolean) AND mailbox_owner IS NULL AND holder IS NULL
           AND (SELECT key_signal FROM facts) IS NULL
        ON CONFLICT (address) WHERE released_at IS NULL DO NOTHING
        RETURNING namespace
    ), clear AS (
        SELECT now FROM base
         WHERE NOT CAST(:holdable AS boolean) OR mailbox_owner IS NOT NULL
            OR holder = :namespace OR EXISTS (SELECT 1 FROM held)
    ), key AS (
        {
        _BIND_KEY.format(
            source="SELECT :namespace, :idempotency_key, :id,"
            " now() + make_interval(secs => :ttl) FROM clear"
        )
    }
    {LOOK_MAIL if look else ""}
    ), created AS (
        {insert_signal("clear.now", "FROM clear", look=look)}
        RETURNING *
    {LOOK_CHECK if look else ""}
    )
    SELECT c.*, {_NEW_VIEW_COLUMNS},
           f.now AS fact_now, f.mailbox_owner AS fact_mailbox_owner, f.holder AS fact_holder,
           f.in_window AS fact_in_window, f.owner_ok AS fact_owner_ok,
           f.under_bound AS fact_under_bound, f.key_signal AS fact_key_signal
      FROM facts f LEFT JOIN created c ON true
    """


_SIGNAL_CREATE_CLEAR: Statement = Statement("signal_create_if_clear", _create_clear_sql(look=False))
_SIGNAL_CREATE_LOOKED: Statement = Statement(
    "signal_create_if_clear_looked", _create_clear_sql(look=True)
)


def signal_create_if_clear(
    session: Connection,
    values: Mapping[Any, Any],
    ttl_hours: float,
    *,
    domain_owner: str | None,
    holdable: bool,
    clear_below: int,
    lookback_hours: float,
    lookahead_hours: float,
    look: FirstLook | None = None,
) -> dict[str, Any]:
    """A create in one statement, when it is clear: the namespace has fewer
    than `clear_below` waiting signals, may use the address (its mailbox's
    owner, else `domain_owner`, is None or the namespace; when it is
    `holdable` and no mailbox's, the namespace holds it already or takes it
    now, nobody holding it), `received_after` is None or inside the
    lookback and lookahead, and the key has no live binding.

    One row always: the new signal's with signal_view_get's columns (`id`
    NULL when nothing was inserted), and the facts the statement decided on
    (`fact_now`, `fact_mailbox_owner`, `fact_holder`, `fact_key_signal`: the
    signal a live binding of the key names) with its verdicts
    (`fact_in_window`, `fact_owner_ok`, `fact_under_bound`), for
    `app.domain.admission` to say why it refused. Inserting nothing, it
    writes nothing; run again (under the namespace's lock, with the exact
    limit), it decides on fresh facts.

    With `look`, the same statement makes the new signal's first look when
    the sink holds no mail it could see: the row comes back as that look
    left it (`last_outcome` 'no_match', its check row written); else as a
    plain create's, its first look still to make."""
    looked = {}
    if look is not None:
        looked = {
            "look_counted": look.counted,
            "look_next_reason": look.next_reason,
            "look_lookback": look.lookback_seconds,
            "look_batch": look.batch_id,
        }
    row = runner.one(
        session,
        _SIGNAL_CREATE_LOOKED if look is not None else _SIGNAL_CREATE_CLEAR,
        {
            **looked,
            **_DEFAULTS,
            **values,
            "metadata": Jsonb(values["metadata"]),
            "address": str(values["recipient"]).strip().lower(),
            "domain_owner": domain_owner,
            "holdable": holdable,
            "clear_below": clear_below,
            "lookback_seconds": lookback_hours * 3600.0,
            "lookahead_seconds": lookahead_hours * 3600.0,
            "ttl": ttl_hours * 3600.0,
        },
    )
    assert row is not None  # one row always
    return row


_VIEW_BY_KEY: Statement = Statement(
    "signal_view_by_key",
    f"""
        SELECT s.*, {_VIEW_COLUMNS}
          FROM idempotency_keys k
          JOIN signals s ON s.id = k.signal_id
          LEFT JOIN messages m ON m.id = s.message_id
         WHERE k.namespace = :ns AND k.key = :key AND k.expires_at > now()
    """,
)


def signal_view_by_key(session: Connection, namespace: str, key: str) -> dict[str, Any] | None:
    """The signal a live idempotency key names, with signal_view_get's columns."""
    return runner.one(session, _VIEW_BY_KEY, {"ns": namespace, "key": key})


_GET: Statement[SignalRow] = Statement("signal_get", "SELECT * FROM signals WHERE id = :id")
_GET_IN: Statement[SignalRow] = Statement(
    "signal_get_in_namespace", _GET.sql + " AND namespace = :ns"
)


def signal_get(
    session: Connection, signal_id: str, namespace: str | None = None
) -> SignalRow | None:
    if namespace is None:
        return runner.one(session, _GET, {"id": signal_id})
    return runner.one(session, _GET_IN, {"id": signal_id, "ns": namespace})


_VIEW_GET: Statement = Statement(
    "signal_view_get",
    f"""
    SELECT s.*, {_VIEW_COLUMNS}
      FROM signals s LEFT JOIN messages m ON m.id = s.message_id
     WHERE s.id = :id
    """,
)
_VIEW_GET_IN: Statement = Statement(
    "signal_view_get_in_namespace", _VIEW_GET.sql + " AND s.namespace = :ns"
)


def signal_view_get(
    session: Connection, signal_id: str, namespace: str | None = None
) -> dict[str, Any] | None:
    """A signal and what its view needs, in one statement: the row, the
    database clock (`view_now`) and its message's summary (`view_message_id`,
    `_received_at`, `_subject`, `_run_marker`; NULL before a match).
    `views.signal_views` then asks nothing more for a waiting or found signal.
    """
    if namespace is None:
        return runner.one(session, _VIEW_GET, {"id": signal_id})
    return runner.one(session, _VIEW_GET_IN, {"id": signal_id, "ns": namespace})


# A signal's timestamps, which a notification's JSON gives as text.
_TIMESTAMPS = tuple(c.name for c in Signal.__table__.columns if isinstance(c.type, DateTime))


def _timestamp(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


def signal_notified_row(payload: str) -> dict[str, Any] | None:
    """The row a notification of a signal that stopped waiting carries
    (migration 0018: its id, a space, then the row and its message's
    summary as JSON), shaped as `signal_view_get` reads it but without
    `view_now`; None for a notification of the id alone."""
    _, space, body = payload.partition(" ")
    if not space:
        return None
    notified = json.loads(body)
    row: dict[str, Any] = notified.pop("row")
    for name in _TIMESTAMPS:
        row[name] = _timestamp(row.get(name))
    notified["view_message_received_at"] = _timestamp(notified["view_message_received_at"])
    row.update(notified)
    return row


_WAITING_LOCK: Statement = Statement(
    "signal_waiting_lock",
    "SELECT pg_advisory_xact_lock(hashtextextended('signalbox.waiting:' || :ns, 0))",
)
_WAITING_COUNT: Statement = Statement(
    "signal_waiting_count",
    "SELECT coalesce(sum(waiting), 0) FROM namespace_waiting WHERE namespace = :ns",
)


def signal_waiting_lock(session: Connection, namespace: str) -> None:
    """Take a transaction-scoped advisory lock on the namespace's waiting
    count: creates and redrives near its quota count one after another, each
    seeing the others' committed rows (in a statement after the lock)."""
    runner.exec(session, _WAITING_LOCK, {"ns": namespace})


def signal_waiting_count(session: Connection, namespace: str, *, serialise: bool = False) -> int:
    """How many of the namespace's signals are waiting: the sum of its rows
    in `namespace_waiting`, which a trigger on `signals` keeps (no scan).

    `serialise` first takes a transaction-scoped advisory lock on the
    namespace, so concurrent creates near the quota count one after another
    and each sees the others' committed rows.
    """
    if serialise:
        signal_waiting_lock(session, namespace)
    row = runner.one(session, _WAITING_COUNT, {"ns": namespace})
    assert row is not None  # an aggregate always answers one row
    return int(row["coalesce"])


_ROWS_MANY: Statement[SignalRow] = Statement(
    "signal_rows_many", "SELECT * FROM signals WHERE id = ANY(:ids) ORDER BY created_at, id"
)


def signal_rows_many(session: Connection, signal_ids: Sequence[str]) -> list[SignalRow]:
    return runner.all(session, _ROWS_MANY, {"ids": list(signal_ids)})


def signal_list_by_run(
    session: Connection,
    namespace: str | None,
    run_id: str,
    *,
    after: tuple[datetime, str] | None = None,
    limit: int,
) -> list[SignalRow]:
    """One page of the run's signals in one namespace, or in every one
    (`namespace` None), oldest first, after the cursor `after`."""
    params: dict[str, Any] = {"ns": namespace, "run": run_id}
    ns_sql = "namespace = :ns AND " if namespace is not None else ""
    sql = (
        "SELECT * FROM signals WHERE "
        + ns_sql
        + "run_id = :run AND "
        + BY_CREATION.after(after, params)
        + BY_CREATION.page(limit, params)
    )
    stmt: Statement[SignalRow] = runner.variant("signal_list_by_run", sql)
    return runner.all(session, stmt, params)


_IDS_BY_RUN: Statement = Statement(
    "signal_ids_by_run",
    "SELECT id FROM signals WHERE namespace = :ns AND run_id = :run ORDER BY created_at, id",
)


def signal_ids_by_run(session: Connection, namespace: str, run_id: str) -> list[str]:
    return [r["id"] for r in runner.all(session, _IDS_BY_RUN, {"ns": namespace, "run": run_id})]


def signal_expire(
    session: Connection, signal_id: str, *, expected: str, reason: str, fence: int | None = None
) -> SignalRow | None:
    """`expected` → expired with `reason`; returns the row, or None if it moved."""
    sql = """
        UPDATE signals
           SET status = :dst, expiry_reason = :reason, expired_at = now(),
               next_check_at = NULL, check_lease_until = NULL, updated_at = now()
         WHERE id = :id AND status = :src
    """
    if fence is not None:
        sql += " AND check_fence = :fence"
    stmt: Statement[SignalRow] = runner.variant("signal_expire", sql + " RETURNING *")
    return runner.one(
        session,
        stmt,
        {
            **transition(Status(expected), Status.EXPIRED).params,
            "id": signal_id,
            "reason": reason,
            "fence": fence,
        },
    )


_REDRIVE: Statement[SignalRow] = Statement(
    "signal_redrive",
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
        """,
)


def signal_redrive(
    session: Connection, signal_id: str, *, expires_in: float, max_checks: int
) -> SignalRow | None:
    """expired → waiting, with a new deadline and budget; history stays."""
    params = {"id": signal_id, "exp": expires_in, "max_checks": max_checks, **REDRIVE.params}
    return runner.one(session, _REDRIVE, params)


_COUNT_BY_STATUS: Statement = Statement(
    "signal_count_by_status", "SELECT status, count(*) FROM signals GROUP BY status"
)


def signal_count_by_status(session: Connection) -> dict[str, int]:
    rows = runner.all(session, _COUNT_BY_STATUS)
    return {r["status"]: int(r["count"]) for r in rows}


def signal_count_by_namespace_provider_status(
    session: Connection, namespace: str | None
) -> list[tuple[str, str, str, int]]:
    sql = "SELECT namespace, provider, status, count(*) FROM signals"
    if namespace is not None:
        sql += " WHERE namespace = :ns"
    stmt = runner.variant(
        "signal_count_by_namespace_provider_status", sql + " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
    )
    rows = runner.all(session, stmt, {"ns": namespace})
    return [(r["namespace"], r["provider"], r["status"], int(r["count"])) for r in rows]
