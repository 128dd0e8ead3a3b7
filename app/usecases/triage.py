"""Use cases of triage: checks timelines, dead letters across namespaces, bulk
redrive and discard, and the console's overview.

Every use case takes a `Principal`: a tenant sees its own namespace only, an
operator every namespace (or the one its `namespace` filter names). A
tenant's filter naming another namespace matches nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from app.db import checks as checks_db
from app.db import dead_letters as dead_letters_db
from app.db import due as due_db
from app.db import signals as signals_db
from app.db import tokens as tokens_db
from app.db.engine import transaction
from app.domain.ids import token_hash
from app.domain.masking import mask_addresses
from app.domain.states import DeadLetterState
from app.errors import Conflict, InvalidInput, NotFound, TooManyWaiting
from app.infra import dispatch
from app.infra.redis import READ_TIMEOUT_SECONDS, client_for, is_redis_url, redis_url
from app.settings import Settings
from app.usecases import views
from app.usecases.auth import Principal
from app.usecases.inputs import NAME_PATTERN, RUN_ID_PATTERN, Discard, Redrive
from app.usecases.signals import QUOTA_RETRY_AFTER_SECONDS

log = logging.getLogger("signalbox.triage")

# Dead letters moved per transaction in a bulk action: locks stay short.
BULK_BATCH = 100

DeadLetterStateName = Literal["open", "redriven", "discarded"]
ExpiryReasonName = Literal[
    "deadline", "check_budget", "provider_errors", "claims_exhausted", "duplicate_messages"
]


class DeadLetterFilter(BaseModel):
    """Which dead letters a list or a bulk action covers; every field optional.
    `why` (the first near miss's, or `none`) and `test_case` name a cause of
    GET /v1/dead-letters/causes."""

    model_config = ConfigDict(extra="forbid")
    state: DeadLetterStateName | None = None
    reason: ExpiryReasonName | None = None
    provider: str | None = Field(default=None, pattern=NAME_PATTERN)
    run_id: str | None = Field(default=None, pattern=RUN_ID_PATTERN)
    namespace: str | None = Field(default=None, pattern=NAME_PATTERN)
    why: str | None = Field(default=None, pattern=r"^[a-z_]{1,40}$")
    test_case: str | None = Field(default=None, min_length=1, max_length=200)


class BulkRedrive(Redrive):
    filter: DeadLetterFilter = Field(default_factory=DeadLetterFilter)
    limit: int = Field(default=50, ge=1, le=500)


class BulkDiscard(Discard):
    filter: DeadLetterFilter = Field(default_factory=DeadLetterFilter)
    limit: int = Field(default=50, ge=1, le=500)


def _scope(caller: Principal, namespace: str | None) -> tuple[str | None, bool]:
    """(namespace to read, whether anything can match): a tenant naming
    another namespace matches nothing rather than seeing its own."""
    scope = caller.scope(namespace)
    return scope, namespace is None or namespace == scope


def _dead_letter_view(row: Mapping[Any, Any]) -> dict[str, Any]:
    return {**views.dead_letter_view(row), "namespace": row["namespace"]}


# ---------------------------------------------------------------- checks and signals


def _check_cursor(cursor: str) -> tuple[Any, int]:
    started_at, check_id = views.decode_cursor(cursor)
    if not check_id.isdigit():
        raise InvalidInput("cursor is not one this API returned", field="cursor")
    return started_at, int(check_id)


def check_view(row: Mapping[Any, Any]) -> dict[str, Any]:
    duration = row["finished_at"] - row["started_at"]
    return {
        "check_id": f"chk_{row['id']}",
        "reason": row["reason"],
        "outcome": row["outcome"],
        "error_code": row["error_code"],
        "started_at": views.iso(row["started_at"]),
        "finished_at": views.iso(row["finished_at"]),
        "duration_ms": max(0, round(duration.total_seconds() * 1000)),
        "messages_seen": row["messages_seen"],
        "generation": row["generation"],
    }


def check_list(
    caller: Principal, signal_id: str, *, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """The signal's checks, oldest first, across its redrives."""
    after = _check_cursor(cursor) if cursor else None
    with transaction() as session:
        if signals_db.signal_get(session, signal_id, caller.scope()) is None:
            raise NotFound(f"no signal {signal_id}")
        rows = checks_db.check_list(session, signal_id, after=after, limit=limit + 1)
    page, more = rows[:limit], len(rows) > limit
    last = page[-1] if more else None
    next_cursor = views.encode_cursor(last["started_at"], str(last["id"])) if last else None
    return [check_view(r) for r in page], next_cursor


def signal_read(caller: Principal, signal_id: str) -> dict[str, Any]:
    """A signal's view, for a tenant in its namespace or an operator in any."""
    with transaction() as session:
        row = signals_db.signal_get(session, signal_id, caller.scope())
        if row is None:
            raise NotFound(f"no signal {signal_id}")
        view = {**views.signal_views(session, [row])[0], "namespace": row["namespace"]}
    return views.operator_view(view) if caller.is_ops else view


def run_signals(
    caller: Principal, run_id: str, namespace: str | None = None
) -> list[dict[str, Any]]:
    """The run's signals (at most 500), in every namespace the caller sees."""
    scope, possible = _scope(caller, namespace)
    if not possible:
        return []
    with transaction() as session:
        rows = signals_db.signal_list_by_run(session, scope, run_id, limit=500)
        found = views.signal_views(session, rows)
    out = [{**v, "namespace": r["namespace"]} for v, r in zip(found, rows, strict=True)]
    return [views.operator_view(v) for v in out] if caller.is_ops else out


# ---------------------------------------------------------------- dead letters


def dead_letter_list(
    caller: Principal, filters: DeadLetterFilter, *, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    after = views.decode_cursor(cursor) if cursor else None
    scope, possible = _scope(caller, filters.namespace)
    if not possible:
        return [], None
    with transaction() as session:
        rows = dead_letters_db.dead_letter_list(
            session, scope, filters.model_dump(), after=after, limit=limit + 1
        )
        page, more = rows[:limit], len(rows) > limit
        signals = {
            r["id"]: r
            for r in signals_db.signal_rows_many(session, sorted({d["signal_id"] for d in page}))
        }
    next_cursor = views.encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more else None
    return [_listed_view(caller, r, signals.get(r["signal_id"])) for r in page], next_cursor


def _listed_view(caller: Principal, row: Mapping[Any, Any], signal: Any) -> dict[str, Any]:
    """A dead letter in a list: its view, its signal's test case, the first
    near miss's why (its cause) and, for a tenant, the recipient."""
    view = _dead_letter_view(row)
    near = row["near_misses"] or []
    view["why"] = near[0].get("why", "none") if near and isinstance(near[0], dict) else "none"
    view["test_case"] = signal["test_case"] if signal is not None else None
    if not caller.is_ops:
        view["recipient"] = signal["recipient"] if signal is not None else None
    return view


def _dead_letter_get(session: Connection, caller: Principal, dead_letter_id: str) -> Any:
    row = dead_letters_db.dead_letter_get(session, dead_letter_id, caller.scope())
    if row is None:
        raise NotFound(f"no dead letter {dead_letter_id}")
    return row


def dead_letter_read(caller: Principal, dead_letter_id: str) -> dict[str, Any]:
    with transaction() as session:
        view = _dead_letter_view(_dead_letter_get(session, caller, dead_letter_id))
    # The one operator rule (the API's and the console's): no address, subjects masked.
    return views.operator_dead_letter_view(view) if caller.is_ops else view


class _SignalMoved(Exception):
    """The dead letter's signal is not expired any more: undo this one move."""


class _NoRoom(Exception):
    """The signal's namespace already has as many waiting signals as it may."""


def _too_many_waiting(max_waiting: int) -> TooManyWaiting:
    return TooManyWaiting(
        f"this namespace already has {max_waiting} waiting signals"
        " (SIGNALBOX_MAX_WAITING_PER_NAMESPACE); redrive when some are found or expired",
        retry_after_seconds=QUOTA_RETRY_AFTER_SECONDS,
    )


def _redrive_one(session: Connection, dl: Mapping[Any, Any], req: Redrive, max_waiting: int) -> Any:
    """open → redriven and its signal expired → waiting, both guarded; None if
    the dead letter was not open. Raises _NoRoom when the signal's namespace
    has `max_waiting` waiting signals (counted one redrive or create at a
    time, as creates near the quota are) and _SignalMoved if the signal was
    not expired (the caller rolls the pair back)."""
    dead_letter_id, signal_id = dl["id"], dl["signal_id"]
    if signals_db.signal_waiting_count(session, dl["namespace"], serialise=True) >= max_waiting:
        raise _NoRoom(dl["namespace"])
    if (
        dead_letters_db.dead_letter_resolve(
            session, dead_letter_id, to_state=DeadLetterState.REDRIVEN, note=None
        )
        is None
    ):
        return None
    row = signals_db.signal_redrive(
        session, signal_id, expires_in=float(req.expires_in_seconds), max_checks=req.max_checks
    )
    if row is None:
        raise _SignalMoved(signal_id)
    return row


def dead_letter_redrive(
    caller: Principal, dead_letter_id: str, req: Redrive, max_waiting: int
) -> dict[str, Any]:
    """open dead letter → redriven, its signal → waiting with a new deadline
    and budget; history (checks, near misses, old dead letters) stays.
    Redriving twice answers 409: it never creates a second signal. A
    namespace with `max_waiting` waiting signals gets 429, as a create does."""
    with transaction() as session:
        dl = _dead_letter_get(session, caller, dead_letter_id)
        try:
            row = _redrive_one(session, dl, req, max_waiting)
        except _NoRoom:
            raise _too_many_waiting(max_waiting) from None
        except _SignalMoved:
            raise Conflict(
                "the signal is not expired any more", code="signal_not_expired"
            ) from None
        if row is None:
            raise Conflict(f"dead letter is {dl['state']}, not open", code="dead_letter_not_open")
        view = views.signal_views(session, [row])[0]
    dispatch.enqueue_check(row["id"])
    return view


def dead_letter_discard(caller: Principal, dead_letter_id: str, req: Discard) -> dict[str, Any]:
    with transaction() as session:
        dl = _dead_letter_get(session, caller, dead_letter_id)
        row = dead_letters_db.dead_letter_resolve(
            session, dead_letter_id, to_state=DeadLetterState.DISCARDED, note=req.note
        )
        if row is None:
            raise Conflict(f"dead letter is {dl['state']}, not open", code="dead_letter_not_open")
        return _dead_letter_view(row)


def _bulk(
    caller: Principal,
    filters: DeadLetterFilter,
    limit: int,
    move: Any,
) -> list[str]:
    """Lock open dead letters matching `filters` BULK_BATCH at a time and apply
    `move(session, row)` to each, one transaction per batch; returns the ids
    moved. A move that finds the row moved by someone else is skipped."""
    scope, possible = _scope(caller, filters.namespace)
    if not possible or filters.state not in (None, DeadLetterState.OPEN):
        return []  # only open dead letters move
    moved: list[str] = []
    skipped: list[str] = []
    wanted = filters.model_dump()
    while len(moved) < limit:
        with transaction() as session:
            rows = dead_letters_db.dead_letter_lock_open(
                session,
                scope,
                wanted,
                skip=skipped,
                limit=min(BULK_BATCH, limit - len(moved)),
            )
            if not rows:
                break
            for row in rows:
                try:
                    with session.begin_nested():
                        done = move(session, row)
                except _SignalMoved:
                    done = False
                (moved if done else skipped).append(row["id"])
    return moved


def dead_letters_redrive(caller: Principal, req: BulkRedrive, max_waiting: int) -> dict[str, Any]:
    """Redrive up to `limit` open dead letters matching the filter; their
    signals are sent for a check after each batch commits. A dead letter
    whose namespace has `max_waiting` waiting signals stays open; when that
    left every match unmoved, 429 as for a create."""
    signal_ids: list[str] = []
    no_room = 0

    def move(session: Connection, row: Mapping[Any, Any]) -> bool:
        nonlocal no_room
        try:
            redriven = _redrive_one(session, row, req, max_waiting)
        except _NoRoom:
            no_room += 1
            return False
        if redriven is not None:
            signal_ids.append(redriven["id"])
        return redriven is not None

    moved = _bulk(caller, req.filter, req.limit, move)
    for signal_id in signal_ids:
        dispatch.enqueue_check(signal_id)
    if not moved and no_room:
        raise _too_many_waiting(max_waiting)
    log.info(
        "dead letters redriven",
        extra={"event": "dead_letters_redriven", "count": len(moved), "by": _who(caller)},
    )
    return {"dead_letter_ids": moved, "count": len(moved)}


def dead_letters_discard(caller: Principal, req: BulkDiscard) -> dict[str, Any]:
    def move(session: Connection, row: Mapping[Any, Any]) -> bool:
        done = dead_letters_db.dead_letter_resolve(
            session, row["id"], to_state=DeadLetterState.DISCARDED, note=req.note
        )
        return done is not None

    moved = _bulk(caller, req.filter, req.limit, move)
    log.info(
        "dead letters discarded",
        extra={"event": "dead_letters_discarded", "count": len(moved), "by": _who(caller)},
    )
    return {"dead_letter_ids": moved, "count": len(moved)}


def _who(caller: Principal) -> str:
    return f"ops:{caller.operator}" if caller.is_ops else f"namespace:{caller.namespace}"


# ---------------------------------------------------------------- causes


def dead_letter_causes(
    caller: Principal, *, since: datetime | None, namespace: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Open dead letters grouped by provider, reason, first near miss's why
    (or `none`) and test case, largest first, each with an example."""
    scope, possible = _scope(caller, namespace)
    if not possible:
        return []
    with transaction() as session:
        rows = dead_letters_db.dead_letter_causes(session, scope, since=since, limit=limit)
    items = []
    for r in rows:
        recommendation = r["example_recommendation"]
        if caller.is_ops:
            recommendation = mask_addresses(recommendation)
        items.append(
            {
                "provider": r["provider"],
                "reason": r["reason"],
                "why": r["why"],
                "test_case": r["test_case"],
                "count": int(r["count"]),
                "first_at": views.iso(r["first_at"]),
                "last_at": views.iso(r["last_at"]),
                "example": {"dead_letter_id": r["example_id"], "recommendation": recommendation},
            }
        )
    return items


# ---------------------------------------------------------------- overview


def overview(caller: Principal, namespace: str | None = None) -> dict[str, Any]:
    """Counts by namespace, provider and status, the oldest due age and the
    open dead letters per namespace, as the caller may see them."""
    scope, possible = _scope(caller, namespace)
    if not possible:
        return {"counts": [], "oldest_due_seconds": 0.0, "open_dead_letters": {}}
    with transaction() as session:
        counts = signals_db.signal_count_by_namespace_provider_status(session, scope)
        oldest = due_db.signal_oldest_due_age(session, scope)
        open_dl = dead_letters_db.dead_letter_count_open_by_namespace(session, scope)
    return {
        "counts": [
            {"namespace": ns, "provider": provider, "status": status, "count": n}
            for ns, provider, status, n in counts
        ],
        "oldest_due_seconds": oldest,
        "open_dead_letters": open_dl,
    }


def principal_still_valid(
    settings: Settings, caller: Principal, fingerprint: str, fingerprint_of: Any
) -> bool:
    """Whether a token of `caller` whose fingerprint (`fingerprint_of(token_hash)`)
    is `fingerprint` is still configured: a console session ends when its
    token is revoked."""
    import hmac

    def matches(token_hashes: list[str]) -> bool:
        return any(hmac.compare_digest(fingerprint_of(h), fingerprint) for h in token_hashes)

    if caller.is_ops:
        return matches(
            [token_hash(t) for t, name in settings.ops_token_map.items() if name == caller.operator]
        )
    configured = [token_hash(t) for t, ns in settings.token_map.items() if ns == caller.namespace]
    if matches(configured):
        return True
    assert caller.namespace is not None
    with transaction() as session:
        stored = tokens_db.token_hashes_of_namespace(session, caller.namespace)
    return matches(stored)


def breaker_states(settings: Settings) -> dict[str, str] | None:
    """Circuit breaker state per provider, from Redis; None when it cannot be read."""
    from app.providers.breaker import snapshot_all

    url = redis_url(settings)
    if not is_redis_url(url):
        return None
    try:
        states: dict[str, str] = dict(snapshot_all(client_for(url, timeout=READ_TIMEOUT_SECONDS)))
    except Exception:  # shown as "unavailable"; the metrics report the outage
        return None
    return states
