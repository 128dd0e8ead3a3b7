"""One message for a tenant whose namespace may see it: headers, text, the
HTML in a sandboxed frame, attachments and raw to download. Operators never
read content: 403.

The HTML is never part of the console's own page: it is the document of an
``<iframe sandbox>`` (no ``allow-scripts``, no ``allow-same-origin``) served
from its own route with ``Content-Security-Policy: default-src 'none';
img-src data: cid:; style-src 'unsafe-inline'; sandbox; form-action 'none';
base-uri 'none'``, so a script in a mail never runs, nothing remote is
loaded, and its forms and refreshes go nowhere, even when the frame is
opened alone as a page of the console's origin.
Inline images (``cid:``) are put in as ``data:`` URIs, up to a budget.
"""

from __future__ import annotations

import base64
import re

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from app.console import session as sessions
from app.console.routes.common import (
    SECURITY_HEADERS,
    PageAnswer,
    SignedIn,
    call,
    error_page,
    render,
)
from app.domain import whole_message
from app.domain.whole_message import ATTACHMENT_ID_PATTERN
from app.usecases import message_content
from app.web.downloads import attachment_response, raw_response
from app.web.params import ID_PATTERN

router = APIRouter(prefix="/console", include_in_schema=False)

FRAME_CSP = (
    "default-src 'none'; img-src data: cid:; style-src 'unsafe-inline';"
    " sandbox; form-action 'none'; base-uri 'none'"
)
# The page itself may frame its own origin's frame document, nothing else.
PAGE_CSP = SECURITY_HEADERS["Content-Security-Policy"] + "; frame-src 'self'"
FRAME_HEADERS = {
    "Content-Security-Policy": FRAME_CSP,
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
# Inline images made data: URIs in the frame, at most this many bytes in all.
INLINE_IMAGES_MAX_BYTES = 5 * 1024 * 1024


_MESSAGE_ID = re.compile(ID_PATTERN)
_ATTACHMENT_ID = re.compile(ATTACHMENT_ID_PATTERN)


def _tenant(
    request: Request, session: sessions.Session, message_id: str, attachment_id: str | None = None
) -> str:
    """The session's namespace; an operator gets the 403 page instead, and an
    id of the wrong shape (nothing the database could hold) the 404 page."""
    namespace = session.principal.namespace
    if session.principal.is_ops or namespace is None:
        raise PageAnswer(
            error_page(request, session, 403, "Refused", "Operators never read message content.")
        )
    if not _MESSAGE_ID.fullmatch(message_id) or (
        attachment_id is not None and not _ATTACHMENT_ID.fullmatch(attachment_id)
    ):
        raise PageAnswer(error_page(request, session, 404, "Not found"))
    return namespace


@router.get("/messages/{message_id}")
async def message(request: Request, message_id: str, session: SignedIn) -> Response:
    namespace = _tenant(request, session, message_id)
    loaded = await call(request, session, message_content.visible_message, namespace, message_id)
    view = await run_in_threadpool(message_content.message_view, loaded)
    response = render(request, "message.html", session=session, m=view)
    response.headers["Content-Security-Policy"] = PAGE_CSP
    return response


@router.get("/messages/{message_id}/html")
async def message_html(request: Request, message_id: str, session: SignedIn) -> Response:
    namespace = _tenant(request, session, message_id)
    loaded = await call(request, session, message_content.visible_message, namespace, message_id)
    html = await run_in_threadpool(_frame_document, loaded)
    return HTMLResponse(html, headers=FRAME_HEADERS)


def _frame_document(loaded: message_content.Loaded) -> str:
    whole = whole_message.read_message(loaded.raw, loaded.message_id)
    html = whole.html
    budget = INLINE_IMAGES_MAX_BYTES
    for att in whole.attachments:
        if not att.content_id or not att.content_type.startswith("image/") or att.size > budget:
            continue
        reference = f"cid:{att.content_id}"
        if reference not in html:
            continue
        data = b"".join(whole_message.attachment_chunks(loaded.raw, att))
        budget -= len(data)
        uri = f"data:{att.content_type};base64,{base64.b64encode(data).decode('ascii')}"
        html = html.replace(reference, uri)
    return html


@router.get("/messages/{message_id}/attachments/{attachment_id}")
async def message_attachment(
    request: Request, message_id: str, attachment_id: str, session: SignedIn
) -> Response:
    namespace = _tenant(request, session, message_id, attachment_id)
    body = await call(
        request,
        session,
        message_content.visible_attachment,
        namespace,
        message_id,
        attachment_id,
    )
    return attachment_response(body, request.headers)


@router.get("/messages/{message_id}/raw")
async def message_raw(request: Request, message_id: str, session: SignedIn) -> Response:
    namespace = _tenant(request, session, message_id)
    loaded = await call(request, session, message_content.visible_message, namespace, message_id)
    return raw_response(loaded.raw, loaded.message_id)
