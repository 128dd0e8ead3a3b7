"""The inbox: `GET /v1/messages` (list and search), one message, its raw
bytes and attachments, delete; the live events are in `inbox_events.py`.

Tenants see their namespace's messages (§11.1), claimed or not; reading
takes nothing. Operators list every namespace's, subjects masked, and read
no content (403 `ops_forbidden`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import Caller, Namespace
from app.api.responses import V1, errors
from app.domain.whole_message import ATTACHMENT_ID_PATTERN
from app.errors import InvalidInput
from app.usecases import inbox, message_content
from app.usecases.inbox import InboxFilter, query_of
from app.web.downloads import attachment_response, raw_response
from app.web.params import Cursor, RunIdQuery

router = APIRouter(prefix="/v1")

MessageId = Annotated[str, Path(pattern=r"^msg_[A-Za-z0-9]{1,60}$", max_length=64)]
AttachmentId = Annotated[str, Path(pattern=ATTACHMENT_ID_PATTERN, max_length=64)]
Recipient = Annotated[str | None, Query(min_length=3, max_length=320)]
Search = Annotated[str | None, Query(max_length=1000)]
InboxLimit = Annotated[int, Query(ge=1, le=500)]
_BYTES = {"description": "The bytes.", "content": {"application/octet-stream": {}}}


def filters_of(
    namespace: str | None,
    *,
    recipient: str | None = None,
    run_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    q: str | None = None,
) -> InboxFilter:
    if recipient is not None and "\x00" in recipient:
        raise InvalidInput("recipient holds a NUL character", field="recipient")
    return InboxFilter(
        recipient=recipient,
        run_id=run_id,
        namespace=namespace,
        since=since,
        until=until,
        query=query_of(q),
    )


@router.get("/messages", response_model=dict[str, Any], responses=errors(*V1))
async def list_messages(
    caller: Caller,
    recipient: Recipient = None,
    run_id: RunIdQuery | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    q: Search = None,
    limit: InboxLimit = 50,
    cursor: Cursor = None,
) -> JSONResponse:
    """The namespace's messages, newest first (operators: every namespace,
    subjects masked), filtered by recipient, run, time and search."""
    filters = filters_of(
        caller.namespace, recipient=recipient, run_id=run_id, since=since, until=until, q=q
    )
    page = await run_in_threadpool(inbox.list_messages, caller, filters, limit=limit, cursor=cursor)
    return JSONResponse({"items": page.items, "next_cursor": page.next_cursor})


@router.delete("/messages", response_model=dict[str, int], responses=errors(*V1, 403))
async def delete_messages(
    namespace: Namespace, recipient: Recipient = None, q: Search = None
) -> JSONResponse:
    """Purge the content of the namespace's own messages to `recipient`
    and/or matching `q` (one of them is required): `{"deleted": N}`."""
    if not recipient and not q:
        raise InvalidInput("give recipient or q: which messages to delete", field="recipient")
    filters = filters_of(namespace, recipient=recipient, q=q)
    deleted = await run_in_threadpool(inbox.delete_matching, namespace, filters)
    return JSONResponse({"deleted": deleted})


@router.get(
    "/messages/{message_id}", response_model=dict[str, Any], responses=errors(*V1, 403, 404)
)
def read_message(message_id: MessageId, namespace: Namespace) -> JSONResponse:
    """The whole message (the fields of `GET /v1/claims/{claim_id}/message`)."""
    loaded = message_content.visible_message(namespace, message_id)
    return JSONResponse(message_content.message_view(loaded))


@router.get(
    "/messages/{message_id}/raw",
    response_class=Response,
    responses={
        200: {"description": "The message.", "content": {"message/rfc822": {}}},
        **errors(*V1, 403, 404),
    },
)
def read_raw(message_id: MessageId, namespace: Namespace) -> Response:
    """The message's bytes as received (`message/rfc822`)."""
    loaded = message_content.visible_message(namespace, message_id)
    return raw_response(loaded.raw, loaded.message_id)


@router.get(
    "/messages/{message_id}/attachments/{attachment_id}",
    response_class=Response,
    responses={
        200: _BYTES,
        304: {"description": "`If-None-Match` matched."},
        **errors(*V1, 403, 404),
    },
)
def read_attachment(
    message_id: MessageId, attachment_id: AttachmentId, namespace: Namespace, request: Request
) -> Response:
    """One attachment's decoded bytes."""
    found = message_content.visible_attachment(namespace, message_id, attachment_id)
    return attachment_response(found, request.headers)


@router.delete(
    "/messages/{message_id}",
    status_code=204,
    response_class=Response,
    responses=errors(*V1, 403, 404),
)
def delete_message(message_id: MessageId, namespace: Namespace) -> Response:
    """Purge one message's content (its summary, receipts and evidence stay)."""
    inbox.message_row(namespace, message_id)  # 404 unless the namespace may see it
    inbox.delete_messages(namespace, [message_id])
    return Response(status_code=204)
