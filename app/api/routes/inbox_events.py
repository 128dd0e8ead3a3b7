"""`GET /v1/messages/events`: the inbox live, as server-sent events.

One `message` event per new message the namespace may see (the list item
of `GET /v1/messages`), from the API process's one feed
(`app/web/inbox_feed.py`, streamed by `app/web/events.py`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from app.api.deps import Namespace
from app.api.responses import V1, errors
from app.web.events import event_stream, sse_response

router = APIRouter(prefix="/v1")


@router.get(
    "/messages/events",
    response_class=StreamingResponse,
    responses={
        200: {"description": "Server-sent events.", "content": {"text/event-stream": {}}},
        **errors(*V1, 403),
    },
)
async def message_events(namespace: Namespace, request: Request) -> StreamingResponse:
    """One `message` event per new message the namespace may see."""
    return sse_response(event_stream(request.app.state.inbox_feed, namespace, request))
