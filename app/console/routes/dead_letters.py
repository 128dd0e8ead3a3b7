"""Dead letters: the filtered list and its bulk redrive or discard, one dead
letter's page and its redrive or discard."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.console.routes.common import (
    SignedIn,
    SignedPost,
    call,
    chosen_filters,
    error_page,
    form_input,
    notice,
    redirect,
    render,
    render_signal_page,
    settings_of,
)
from app.usecases import triage
from app.usecases.inputs import Discard, Redrive
from app.usecases.triage import BulkDiscard, BulkRedrive, DeadLetterFilter

router = APIRouter(prefix="/console", include_in_schema=False)

STATES = ("open", "redriven", "discarded")
REASONS = (
    "deadline",
    "check_budget",
    "provider_errors",
    "claims_exhausted",
    "duplicate_messages",
)


@router.get("/dead-letters")
async def dead_letters(request: Request, session: SignedIn) -> Response:
    query = dict(request.query_params)
    chosen = chosen_filters(query)
    try:
        filters = DeadLetterFilter(**chosen)  # type: ignore[arg-type]  # validated here
    except ValidationError as exc:
        field = ".".join(str(p) for p in exc.errors()[0]["loc"])
        return error_page(
            request,
            session,
            422,
            "Invalid filter",
            f"The filter {field!r} has a value the console does not know.",
        )
    cursor = query.get("cursor") or None
    items, next_cursor = await call(
        request,
        session,
        lambda: triage.dead_letter_list(session.principal, filters, limit=50, cursor=cursor),
    )
    next_url = (
        "/console/dead-letters?" + urlencode({**chosen, "cursor": next_cursor})
        if next_cursor
        else None
    )
    return render(
        request,
        "dead_letters.html",
        session=session,
        items=items,
        chosen=chosen,
        states=STATES,
        reasons=REASONS,
        next_url=next_url,
        notice=notice(query),
    )


@router.post("/dead-letters/{action}")
async def dead_letters_bulk(request: Request, action: str, posted: SignedPost) -> Response:
    session, form = posted
    if action not in ("redrive", "discard"):
        return error_page(request, session, 404, "Not found")
    chosen = chosen_filters(form)

    def bulk() -> BulkRedrive | BulkDiscard:
        if action == "redrive":
            return BulkRedrive(
                filter=DeadLetterFilter(**chosen),  # type: ignore[arg-type]
                limit=int(form.get("limit") or 50),
                expires_in_seconds=int(form.get("expires_in_seconds") or 120),
                max_checks=int(form.get("max_checks") or 30),
            )
        return BulkDiscard(
            filter=DeadLetterFilter(**chosen),  # type: ignore[arg-type]
            limit=int(form.get("limit") or 50),
            note=form.get("note", ""),
        )

    req = form_input(
        request,
        session,
        bulk,
        "Invalid form",
        "Check the numbers (limit 1 to 500) and, to discard, write a note.",
    )
    if action == "redrive":
        limit = settings_of(request).max_waiting_per_namespace
        result = await call(
            request, session, triage.dead_letters_redrive, session.principal, req, limit
        )
    else:
        result = await call(request, session, triage.dead_letters_discard, session.principal, req)
    done = "redriven" if action == "redrive" else "discarded"
    return redirect(
        "/console/dead-letters?" + urlencode({**chosen, "done": done, "count": result["count"]})
    )


@router.get("/dead-letters/{dead_letter_id}")
async def dead_letter(request: Request, dead_letter_id: str, session: SignedIn) -> Response:
    found = await call(request, session, triage.dead_letter_read, session.principal, dead_letter_id)
    return await render_signal_page(
        request, session, "dead_letter.html", found["signal_id"], dl=found
    )


@router.post("/dead-letters/{dead_letter_id}/redrive")
async def dead_letter_redrive(
    request: Request, dead_letter_id: str, posted: SignedPost
) -> Response:
    session, form = posted
    req = form_input(
        request,
        session,
        lambda: Redrive(
            expires_in_seconds=int(form.get("expires_in_seconds") or 120),
            max_checks=int(form.get("max_checks") or 30),
        ),
        "Invalid form",
        "expires_in_seconds is 1 to 86400 and max_checks 1 to 10000.",
    )
    view = await call(
        request,
        session,
        triage.dead_letter_redrive,
        session.principal,
        dead_letter_id,
        req,
        settings_of(request).max_waiting_per_namespace,
    )
    return redirect(f"/console/signals/{view['signal_id']}?done=redriven")


@router.post("/dead-letters/{dead_letter_id}/discard")
async def dead_letter_discard(
    request: Request, dead_letter_id: str, posted: SignedPost
) -> Response:
    session, form = posted
    req = form_input(
        request,
        session,
        lambda: Discard(note=form.get("note", "")),
        "A note is needed",
        "Say why this dead letter is discarded (1 to 2000 characters).",
    )
    await call(request, session, triage.dead_letter_discard, session.principal, dead_letter_id, req)
    return redirect(f"/console/dead-letters/{dead_letter_id}?done=discarded")
