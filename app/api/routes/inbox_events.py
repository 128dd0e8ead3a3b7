"""`GET /v1/messages/events`: the inbox live, as server-sent events.

One `message` event per new message the namespace may see (the list item
of `GET /v1/messages`), from the API process's one feed
(`app/api/inbox_feed.py`); a comment line every HEARTBEAT_SECONDS keeps
proxies from closing an idle stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from app.api.deps import Namespace
from app.api.inbox_feed import InboxFeed
from app.api.responses import V1, errors

router = APIRouter(prefix="/v1")

HEARTBEAT_SECONDS = 15.0


async def event_stream(feed: InboxFeed, namespace: str, request: Request) -> AsyncIterator[bytes]:
    """The stream's bytes until the client goes away."""
    async with feed.subscribe(namespace) as subscriber:
        yield b": signalbox inbox\n\n"
        while not await request.is_disconnected():
            try:
                item = await asyncio.wait_for(subscriber.queue.get(), HEARTBEAT_SECONDS)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            data = json.dumps(item, separators=(",", ":"))
            yield f"event: message\nid: {item['message_id']}\ndata: {data}\n\n".encode()


def sse_response(stream: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


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
