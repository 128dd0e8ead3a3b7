"""The console's first page: the largest causes of open dead letters,
signals by status, circuits, webhook deliveries and the latest open dead
letters."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from app.console.routes.common import SignedIn, render, settings_of
from app.usecases import triage, webhooks
from app.usecases.triage import DeadLetterFilter

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("")
async def overview(request: Request, session: SignedIn) -> Response:
    caller = session.principal
    data = await run_in_threadpool(triage.overview, caller)
    breakers = await run_in_threadpool(triage.breaker_states, settings_of(request))
    hooks = await run_in_threadpool(webhooks.delivery_status, caller.scope())
    open_items, _ = await run_in_threadpool(
        lambda: triage.dead_letter_list(
            caller, DeadLetterFilter(state="open"), limit=20, cursor=None
        )
    )
    causes = await run_in_threadpool(lambda: triage.dead_letter_causes(caller, since=None, limit=5))
    by_status: dict[str, int] = {}
    for row in data["counts"]:
        by_status[row["status"]] = by_status.get(row["status"], 0) + row["count"]
    return render(
        request,
        "overview.html",
        session=session,
        data=data,
        by_status=by_status,
        breakers=breakers,
        hooks=hooks,
        open_items=open_items,
        causes=causes,
    )
