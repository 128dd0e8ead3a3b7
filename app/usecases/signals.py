"""Use cases of signals: create (idempotent), read, list, push (the sink).

Each is one transaction and callable from any front door. Sending tasks
happens after commit, through `app.infra.dispatch`; a lost send is repaired by the
sweep because the database says what is due.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Connection

from app.db import due as due_db
from app.db import signals as signals_db
from app.db import takes as takes_db
from app.db.engine import autocommit, transaction
from app.domain import ownership
from app.domain.admission import (
    Admission,
    CreateFacts,
    CreateOutcome,
    admission,
    conflicting_fields,
    replay_outcome,
)
from app.domain.expectations import Expect, effective_settle
from app.domain.ids import new_id
from app.domain.scheduling import first_check_delay
from app.domain.states import Status
from app.errors import (
    IdempotencyConflict,
    NotFound,
    ProviderNotAllowed,
    RecipientNotOwned,
    SignalboxError,
    TooManyWaiting,
    UnknownProvider,
)
from app.infra import dispatch
from app.infra.keys import recipient_hash
from app.observability import metrics
from app.providers.runtime import provider_configs, pushes
from app.settings import Settings
from app.usecases import holds, views
from app.usecases.checks import BATCH_LIMIT, CheckRequest, CheckRunner, Why
from app.usecases.inputs import SignalCreate, received_after_error

log = logging.getLogger("signalbox.signals")

# Creates that count without the namespace's lock: exact unless more than this
# many creates of one namespace are in flight at once while it is this close to
# its quota (then it can be over by at most the number in flight).
QUOTA_SLACK = 64
QUOTA_RETRY_AFTER_SECONDS = 10.0
# Times the create statement runs when another create moved first (took the
# address's hold, bound the key) or a lapsed hold was released, before the
# caller is asked to retry.
CREATE_ATTEMPTS = 4


@dataclass(frozen=True)
class Created:
    view: dict[str, Any]
    created: bool
    # The first look a new signal whose provider pushes (the sink) still
    # needs, for the caller to make once its answer is on its way; None when
    # the create made it (one statement on its own connection) or a task was sent.
    first_look: Callable[[], None] | None = None

    @property
    def outcome(self) -> CreateOutcome:
        return CreateOutcome.CREATED if self.created else replay_outcome(self.view["status"])


def check_provider(settings: Settings, provider: str, namespace: str) -> None:
    """The provider is configured and `namespace` may use it (its `namespaces`)."""
    config = provider_configs(settings).get(provider)
    if config is None:
        raise UnknownProvider(f"provider {provider!r} is not configured", field="provider")
    if config.namespaces is not None and namespace not in config.namespaces:
        raise ProviderNotAllowed(
            f"provider {provider!r} is not open to this namespace", field="provider"
        )


def signal_create(
    settings: Settings,
    namespace: str,
    req: SignalCreate,
    idempotency_key: str | None,
    *,
    runner: CheckRunner | None = None,
) -> Created:
    """Create a signal, or return the one its idempotency key already names.

    With `runner` (the API's), a new signal of a provider that pushes gets
    its first look in this process, not as a task (docs/api.md, "The first
    look"): when the sink holds no mail for it, made by the create's own
    statement (`runner.presumed_look`), then one read on the same connection
    for mail stored meanwhile (`runner.after_created`); else the answer's
    `first_look`, `runner.check` of a `Why.FIRST_LOOK` (or `PUSH`) request."""
    check_provider(settings, req.provider, namespace)
    key = idempotency_key or f"{req.run_id}:{req.test_case}"
    domain_owner = settings.namespace_domain_owners.get(ownership.domain_of(req.recipient))
    holdable = domain_owner is None and not ownership.is_shared(
        req.recipient, settings.shared_address_entries
    )
    signal_id = new_id("sig")
    pushing = pushes(settings, req.provider)
    # The runner that makes this signal's first look here (a provider that pushes).
    looker = runner if pushing else None
    values = {
        "id": signal_id,
        "namespace": namespace,
        "idempotency_key": key,
        "run_id": req.run_id,
        "test_case": req.test_case,
        "recipient": req.recipient,
        "subject_contains": req.subject_contains,
        "body_contains": req.body_contains,
        "received_after": req.received_after,
        "expires_in": float(req.expires_in_seconds),
        "max_checks": req.max_checks,
        "provider": req.provider,
        "require_run_marker": req.require_run_marker,
        "metadata": req.metadata,
        "max_claims": settings.max_claims,
        "expect": req.expect,
        "settle_seconds": effective_settle(Expect(req.expect), req.settle_seconds),
        "first_check_in": first_check_delay(req.expires_in_seconds, req.max_checks, pushes=pushing),
    }
    # The create is one statement, committed alone: the database inserts only
    # when its facts clear every check. When they do not, it says what it saw
    # and `admission` decides: an answer, or a step before the same statement
    # runs again (the exact count near the quota, a lapsed hold released).
    # A sink signal's first look is made by the create's own statement when
    # the sink holds no mail it could see (decided here before it: the
    # breaker, the next step); under the namespace's lock it is left for later.
    look = looker.presumed_look(values) if looker is not None else None
    exactly = False
    for _ in range(CREATE_ATTEMPTS):
        with autocommit() if not exactly else transaction() as session:
            if exactly:
                signals_db.signal_waiting_lock(session, namespace)
            began = time.perf_counter()
            row = signals_db.signal_create_if_clear(
                session,
                values,
                settings.idempotency_ttl_hours,
                domain_owner=domain_owner,
                holdable=holdable,
                clear_below=settings.max_waiting_per_namespace - (0 if exactly else QUOTA_SLACK),
                lookback_hours=settings.max_lookback_hours,
                lookahead_hours=settings.max_lookahead_hours,
                look=None if exactly else look,
            )
            if row["id"] is not None:
                took = time.perf_counter() - began
                view = views.signal_views(session, [row])[0]
                # Committed on its own (autocommit): what its first look still
                # needs is read on this connection; under the namespace's
                # lock, the first look is made after the answer.
                owed = _first_look_owed(req, row, looker, None if exactly else session, took)
                break
        refused = admission(namespace, _create_facts(req, row, holdable, exactly))
        if refused is Admission.EXISTING:
            return _existing(namespace, key, values)
        if refused is Admission.COUNT_EXACTLY:
            exactly = True
        elif refused is Admission.HELD_BY_OTHER:
            holds.release_lapsed(settings, namespace, req.recipient)
        elif refused is not Admission.RACED:
            raise _refusal(settings, refused)
    else:
        raise IdempotencyConflict("the create met concurrent changes; retry the request")
    return _created(settings, namespace, req, view, looker, owed)


def _create_facts(
    req: SignalCreate, row: Mapping[str, Any], holdable: bool, exactly: bool
) -> CreateFacts:
    """The facts the create statement returned when it inserted nothing."""
    return CreateFacts(
        now=row["fact_now"],
        received_after=req.received_after,
        in_window=row["fact_in_window"],
        owner_ok=row["fact_owner_ok"],
        under_bound=row["fact_under_bound"],
        needs_hold=holdable and row["fact_mailbox_owner"] is None,
        holder=row["fact_holder"],
        key_signal=row["fact_key_signal"],
        counted_exactly=exactly,
    )


def _existing(namespace: str, key: str, values: dict[str, Any]) -> Created:
    """A replay: the signal the key names, unless its fields differ."""
    with autocommit() as session:
        row = signals_db.signal_view_by_key(session, namespace, key)
        if row is None:  # the key lapsed after the statement
            raise IdempotencyConflict("idempotency key changed hands; retry the request")
        differing = conflicting_fields(row, values)
        if differing:
            raise IdempotencyConflict(
                "this idempotency key already names a signal with a different "
                + ", ".join(differing),
                fields=differing,
            )
        return Created(view=views.signal_views(session, [row])[0], created=False)


def _refusal(settings: Settings, refused: Admission) -> SignalboxError:
    """The error a create refused for `refused` answers."""
    if refused is Admission.TOO_EARLY or refused is Admission.TOO_LATE:
        return received_after_error(
            early=refused is Admission.TOO_EARLY,
            lookback_hours=settings.max_lookback_hours,
            lookahead_hours=settings.max_lookahead_hours,
        )
    if refused is Admission.NOT_OWNED:
        # Says no more than that: which namespace owns it is not this caller's business.
        return RecipientNotOwned(
            "the address belongs to another namespace (a mailbox or an owned domain)",
            field="recipient",
        )
    assert refused is Admission.TOO_MANY, refused
    return TooManyWaiting(
        f"this namespace already has {settings.max_waiting_per_namespace} waiting signals"
        " (SIGNALBOX_MAX_WAITING_PER_NAMESPACE); retry when some are found or expired",
        retry_after_seconds=QUOTA_RETRY_AFTER_SECONDS,
    )


def _first_look_owed(
    req: SignalCreate,
    row: Mapping[str, Any],
    runner: CheckRunner | None,
    session: Connection | None,
    seconds: float,
) -> CheckRequest | None:
    """The first look a new signal (`row`, committed) still needs from
    `runner` (None: no runner here, or its provider does not push, and a
    task looks) once the answer is sent: None when there is no runner, or
    the create made it (the sink held no mail for it, nor holds any stored
    since: read on the create's `session`, whose statement took `seconds`)."""
    if runner is None:
        return None
    look = CheckRequest(row["id"], Why.FIRST_LOOK, req.provider, created=row)
    return look if session is None else runner.after_created(look, session, seconds)


def _created(
    settings: Settings,
    namespace: str,
    req: SignalCreate,
    view: dict[str, Any],
    runner: CheckRunner | None,
    owed: CheckRequest | None,
) -> Created:
    """What follows a new signal's commit: count it, log it, send its first
    look (or hand the one still owed to the caller, to make here with
    `runner`: given only for a provider that pushes)."""
    signal_id = view["signal_id"]
    metrics.signals_created(namespace)
    log.info(
        "signal created",
        extra={
            "event": "signal_created",
            "run_id": req.run_id,
            "signal_id": signal_id,
            "recipient_hash": recipient_hash(req.recipient, settings),
            "provider": req.provider,
        },
    )
    if runner is not None:
        if owed is None:  # made with the create
            return Created(view=view, created=True)
        return Created(view=view, created=True, first_look=partial(_first_look, runner, owed))
    dispatch.enqueue_first_look(req.provider, signal_id, settings.requeue_after_seconds)
    return Created(view=view, created=True)


def _first_look(runner: CheckRunner, request: CheckRequest) -> None:
    runner.check(request)


def signal_read(namespace: str | None, signal_id: str, *, masked: bool = False) -> dict[str, Any]:
    """The signal's view; `namespace` None reads any namespace (operators,
    who get it `masked`)."""
    with autocommit() as session:  # the long poll's re-reads: no BEGIN, no COMMIT
        row = signals_db.signal_view_get(session, signal_id, namespace)
        if row is None:
            raise NotFound(f"no signal {signal_id}")
        view = views.signal_views(session, [row])[0]
    return views.operator_view(view) if masked else view


# What a notification's row is enough for: the view of a signal in one of
# these asks the database for nothing more (an expired one shows its dead letter).
_NOTIFIED_VIEWS = frozenset((Status.FOUND, Status.ARRIVED, Status.ABSENT))


def signal_view_notified(payload: str, *, masked: bool = False) -> dict[str, Any] | None:
    """The view `signal_read` would answer for the signal whose notification
    (it stopped waiting) carried `payload`, made from it with no read; None
    when the payload is its id alone or its status needs more (the caller
    reads the signal instead). The caller has read this signal before, in
    its own scope: the notification carries only that signal."""
    row = signals_db.signal_notified_row(payload)
    if row is None or Status(row["status"]) not in _NOTIFIED_VIEWS:
        return None
    view = views.signal_views(None, [row])[0]
    return views.operator_view(view) if masked else view


def signal_list(
    namespace: str | None, run_id: str, *, limit: int, cursor: str | None, masked: bool = False
) -> tuple[list[dict[str, Any]], str | None]:
    after = views.decode_cursor(cursor) if cursor else None
    with transaction() as session:
        rows = signals_db.signal_list_by_run(
            session, namespace, run_id, after=after, limit=limit + 1
        )
        page, more = rows[:limit], len(rows) > limit
        items = views.signal_views(session, page)
    if masked:
        items = [views.operator_view(v) for v in items]
    next_cursor = views.encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more else None
    return items, next_cursor


def push(
    provider: str,
    recipients: Iterable[str] | None = None,
    namespace: str | None = None,
    *,
    runner: CheckRunner | None = None,
) -> list[str]:
    """A provider said mail arrived: check its waiting signals now.

    Signals are made due in short transactions of PUSH_PAGE rows (a push
    never holds thousands of row locks), and one check is asked per check
    batch (a check takes every due signal of its provider): made here by
    `runner` when the caller gives one (the sink), else sent as a task. A
    check that fails here sends its task (the runner's failure policy).

    Made here, the first page's statement also takes the first batch for its
    check (`takes_db.signal_push_and_lock`: one round trip and one commit, not
    two), and that check looks at what it took."""
    ids: list[str] = []
    after: tuple[datetime, str] | None = None
    # Read once: every page pushes the same recipients.
    rcpts = None if recipients is None else sorted({r.lower() for r in recipients})
    while True:
        taken = None
        with autocommit() as session:  # one unit: its own transaction
            if runner is not None and after is None and namespace is None and rcpts:
                page, taken = takes_db.signal_push_and_lock(
                    session,
                    provider,
                    rcpts,
                    limit=PUSH_PAGE,
                    lease_seconds=runner.settings.check_lease_seconds,
                    batch_limit=BATCH_LIMIT,
                    coalesce_seconds=runner.settings.coalesce_window_seconds,
                )
            else:
                page = due_db.signal_push_due(
                    session, provider, rcpts, namespace, after=after, limit=PUSH_PAGE
                )
        if taken and runner is not None:  # leased for this check: made whatever the page holds
            runner.check(CheckRequest(taken[0]["id"], Why.PUSH, provider, taken=taken))
        for i, (signal_id, _) in enumerate(page, start=len(ids)):
            if i % BATCH_LIMIT != 0 or (i == 0 and taken is not None):
                continue  # in a check's batch, or taken with the push
            if runner is None:
                dispatch.enqueue_check(signal_id)
                continue
            runner.check(CheckRequest(signal_id, Why.PUSH, provider))
        ids.extend(signal_id for signal_id, _ in page)
        if len(page) < PUSH_PAGE:
            return ids
        after = (page[-1][1], page[-1][0])


def inbound(settings: Settings, namespace: str, provider: str) -> list[str]:
    """A provider's webhook for `namespace`: its signals waiting on it are checked now."""
    check_provider(settings, provider, namespace)
    return push(provider, namespace=namespace)


# Rows a push makes due per transaction.
PUSH_PAGE = 200
