"""One signal's page and one run's page (its signals and dead letters)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from app.console.routes.common import SignedIn, call, error_page, render, render_signal_page
from app.usecases import timeline, triage
from app.usecases.triage import DeadLetterFilter

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("/signals/{signal_id}")
async def signal(request: Request, signal_id: str, session: SignedIn) -> Response:
    view = await call(request, session, triage.signal_read, session.principal, signal_id)
    events = await call(request, session, timeline.signal_timeline, session.principal, signal_id)
    return await render_signal_page(
        request,
        session,
        "signal.html",
        signal_id,
        s=view,
        events=events,
        refresh=view["status"] == "waiting",
    )


@router.get("/runs/{run_id}")
async def run(request: Request, run_id: str, session: SignedIn) -> Response:
    caller = session.principal
    namespace = request.query_params.get("namespace") or None
    items = await run_in_threadpool(triage.run_signals, caller, run_id, namespace)
    try:
        run_filter = DeadLetterFilter(run_id=run_id, namespace=namespace)
    except ValidationError:
        return error_page(request, session, 404, "Not found")
    dls, _ = await run_in_threadpool(
        lambda: triage.dead_letter_list(caller, run_filter, limit=500, cursor=None)
    )
    if not items and not dls:
        return error_page(request, session, 404, "Not found", f"No signals for run {run_id}.")
    by_status: dict[str, int] = {}
    for item in items:
        by_status[item["status"]] = by_status.get(item["status"], 0) + 1
    return render(
        request,
        "run.html",
        session=session,
        run_id=run_id,
        items=items,
        dead_letters=dls,
        by_status=by_status,
    )
