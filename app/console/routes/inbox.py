"""The inbox: the namespace's messages, newest first, filtered by recipient,
subject, run and time; each row opens the message's page; delete. New mail
appears live (`inbox.js` listens to `/console/inbox/events`, the same feed
as `GET /v1/messages/events`). Tenants only: an operator gets the 403 page.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from app.console import session as sessions
from app.console.routes.common import (
    SECURITY_HEADERS,
    PageAnswer,
    SignedIn,
    SignedPost,
    call,
    error_page,
    redirect,
    render,
)
from app.errors import InvalidInput
from app.usecases import inbox
from app.usecases.inbox import InboxFilter, query_of
from app.web.events import event_stream, sse_response

router = APIRouter(prefix="/console", include_in_schema=False)

FIELDS = ("recipient", "subject", "run_id", "since", "until", "q")
# The page runs its one script (`/console/static/inbox.js`) and opens its event stream.
PAGE_CSP = SECURITY_HEADERS["Content-Security-Policy"] + "; script-src 'self'; connect-src 'self'"


def _tenant(request: Request, session: sessions.Session) -> str:
    namespace = session.principal.namespace
    if session.principal.is_ops or namespace is None:
        raise PageAnswer(
            error_page(request, session, 403, "Refused", "Operators never read the inbox.")
        )
    return namespace


def _moment(value: str | None, field: str) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{field} is not a date or time", field=field) from None


def _filters(namespace: str, chosen: dict[str, str]) -> InboxFilter:
    terms = chosen.get("q", "")
    if chosen.get("subject"):
        subject = chosen["subject"].replace('"', " ")
        terms = f'{terms} subject:"{subject}"'
    return InboxFilter(
        recipient=chosen.get("recipient") or None,
        run_id=chosen.get("run_id") or None,
        namespace=namespace,
        since=_moment(chosen.get("since"), "since"),
        until=_moment(chosen.get("until"), "until"),
        query=query_of(terms.strip()),
    )


@router.get("/inbox")
async def inbox_page(request: Request, session: SignedIn) -> Response:
    namespace = _tenant(request, session)
    chosen = {k: v for k in FIELDS if (v := request.query_params.get(k, "").strip())}
    cursor = request.query_params.get("cursor") or None

    def page() -> inbox.Page:
        return inbox.list_messages(
            session.principal, _filters(namespace, chosen), limit=50, cursor=cursor
        )

    found = await call(request, session, page)
    next_url = (
        "/console/inbox?" + urlencode({**chosen, "cursor": found.next_cursor})
        if found.next_cursor
        else None
    )
    response = render(
        request,
        "inbox.html",
        session=session,
        items=found.items,
        chosen=chosen,
        next_url=next_url,
        live=json.dumps(
            {
                "recipient": chosen.get("recipient", ""),
                "others": any(k != "recipient" for k in chosen) or cursor is not None,
            }
        ),
        done=request.query_params.get("done"),
    )
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


@router.get("/inbox/events")
async def inbox_events(request: Request, session: SignedIn) -> StreamingResponse:
    namespace = _tenant(request, session)
    stream: AsyncIterator[bytes] = event_stream(request.app.state.inbox_feed, namespace, request)
    return sse_response(stream)


@router.post("/inbox/delete")
async def inbox_delete(request: Request, posted: SignedPost) -> Response:
    session, form = posted
    namespace = _tenant(request, session)
    message_id = form.get("message_id", "")
    await call(request, session, inbox.message_row, namespace, message_id)
    await call(request, session, inbox.delete_messages, namespace, [message_id])
    return redirect("/console/inbox?done=deleted")
