"""The inbox live, as server-sent events: the bytes of one subscriber's stream
and the answer that carries them. Shared by `GET /v1/messages/events` and the
console's `/console/inbox/events`; a comment line every HEARTBEAT_SECONDS
keeps proxies from closing an idle stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from app.web.inbox_feed import InboxFeed

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
