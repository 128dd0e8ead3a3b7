"""Signals, mailboxes, push and evidence: thin front doors over the use cases."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from app.api.deps import AppSettings, Caller, Namespace
from app.api.notify import Wake
from app.api.outcomes import CREATE_CODES
from app.api.responses import V1, errors
from app.usecases import cancel, evidence, mailboxes, signals, typos
from app.usecases.inputs import Cancel, MailboxCreate, SignalCreate
from app.web.params import (
    Cursor,
    Limit,
    MailboxId,
    NamespaceQuery,
    ProviderPath,
    RunIdPath,
    RunIdQuery,
    SignalId,
)

router = APIRouter(prefix="/v1")

PENDING = ("waiting", "provider_error")
# Safety net only: a missed notification costs at most this much latency.
RECHECK_SECONDS = 5.0


@router.post("/signals", status_code=201, responses=errors(*V1, 403, 409, 429))
def create_signal(
    request: Request,
    body: SignalCreate,
    namespace: Namespace,
    settings: AppSettings,
    idempotency_key: Annotated[str | None, Header(max_length=512)] = None,
) -> JSONResponse:
    created = signals.signal_create(
        settings,
        namespace,
        body,
        idempotency_key,
        runner=request.app.state.check_runner,
    )
    answer = created.view
    # A likely typo is pointed out; the signal is created all the same.
    warnings = typos.recipient_warnings(settings, body.recipient)
    if warnings:
        answer = {**answer, "warnings": warnings}
    # A sink signal's first look is made here, once the answer is sent.
    later = BackgroundTask(created.first_look) if created.first_look else None
    return JSONResponse(answer, status_code=CREATE_CODES[created.outcome], background=later)


# Answered as a JSONResponse like the claim routes (see app/api/routes/claims.py).
@router.get("/signals/{signal_id}", response_model=dict[str, Any], responses=errors(*V1, 404, 429))
async def get_signal(
    signal_id: SignalId,
    request: Request,
    caller: Caller,
    wait: Annotated[int, Query(ge=0, le=60)] = 0,
    namespace: NamespaceQuery = None,
) -> JSONResponse:
    """Long poll: answers once the result leaves waiting/provider_error, or after `wait` s.
    Operators read any namespace's signal, its subject masked."""
    read = functools.partial(
        signals.signal_read, caller.scope(namespace), signal_id, masked=caller.is_ops
    )
    if wait == 0:
        return JSONResponse(await run_in_threadpool(read))
    notifier = request.app.state.notifier
    # Subscribe before the one read: a change after it cannot be missed.
    async with notifier.subscribe(signal_id) as changed:
        view = await run_in_threadpool(read)
        if view["result"] not in PENDING:
            return JSONResponse(view)
        with request.app.state.long_polls.hold():  # 429 too_many_long_polls beyond the cap
            return JSONResponse(
                await _wait_for_change(request, read, changed, view, wait, masked=caller.is_ops)
            )


async def _wait_for_change(
    request: Request,
    read: Callable[[], dict[str, Any]],
    changed: Wake,
    view: dict[str, Any],
    wait: int,
    *,
    masked: bool,
) -> dict[str, Any]:
    """Wait for a notification (the signal stopped waiting) or RECHECK_SECONDS.
    A notification that carries the view answers with it; any other wake-up
    reads the signal again. The first read was made in the caller's scope,
    and a notification is of this signal only."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while view["result"] in PENDING:
        remaining = deadline - loop.time()
        if remaining <= 0 or await request.is_disconnected():
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.event.wait(), timeout=min(remaining, RECHECK_SECONDS))
        payload = changed.take()
        notified = signals.signal_view_notified(payload, masked=masked) if payload else None
        view = notified if notified is not None else await run_in_threadpool(read)
    return view


@router.post(
    "/signals/{signal_id}/cancel",
    response_model=dict[str, Any],
    responses=errors(*V1, 403, 404, 409),
)
def cancel_signal(signal_id: SignalId, body: Cancel, namespace: Namespace) -> JSONResponse:
    """End a signal its test no longer waits for: `cancelled`, no dead letter
    (again → the same; a signal that already ended otherwise → 409 `not_cancellable`)."""
    return JSONResponse(cancel.signal_cancel(namespace, signal_id, body))


@router.get("/signals", responses=errors(*V1))
def list_signals(
    caller: Caller,
    run_id: RunIdQuery,
    limit: Limit = 50,
    cursor: Cursor = None,
    namespace: NamespaceQuery = None,
) -> dict[str, Any]:
    items, next_cursor = signals.signal_list(
        caller.scope(namespace), run_id, limit=limit, cursor=cursor, masked=caller.is_ops
    )
    return {"items": items, "next_cursor": next_cursor}


@router.post("/mailboxes", status_code=201, responses=errors(*V1, 403, 429))
def create_mailbox(
    body: MailboxCreate, namespace: Namespace, settings: AppSettings
) -> dict[str, Any]:
    return mailboxes.mailbox_create(settings, namespace, body)


@router.delete("/mailboxes/{mailbox_id}", status_code=204, responses=errors(*V1, 403, 404))
def delete_mailbox(mailbox_id: MailboxId, namespace: Namespace, settings: AppSettings) -> Response:
    mailboxes.mailbox_delete(settings, namespace, mailbox_id)
    return Response(status_code=204)


@router.post("/inbound/{provider}", status_code=202, responses=errors(*V1, 403))
def inbound(provider: ProviderPath, namespace: Namespace, settings: AppSettings) -> dict[str, Any]:
    """A provider's webhook: this namespace's signals waiting on it are checked now."""
    ids = signals.inbound(settings, namespace, provider)
    return {"provider": provider, "signals_checked": len(ids)}


@router.get("/runs/{run_id}/evidence", responses=errors(*V1, 403, 404))
def run_evidence(run_id: RunIdPath, namespace: Namespace) -> dict[str, Any]:
    return evidence.run_evidence(namespace, run_id)
