"""The dead-letter webhook's outbound POST: one request, bounded in time as a
whole, answering the receiver's HTTP code or the kind of its failure."""

from __future__ import annotations

import asyncio

import httpx


def post_within(
    url: str, body: bytes, headers: dict[str, str], seconds: float
) -> tuple[int | None, str | None]:
    """POST `body` to `url`; (the receiver's HTTP code, None), or (None, the
    kind of failure): "DeadlineExceeded" past `seconds`, else the httpx
    error's class name (never its text: the URL may carry a secret)."""
    try:
        return asyncio.run(_post_within(url, body, headers, seconds)), None
    except TimeoutError:
        return None, "DeadlineExceeded"
    except httpx.HTTPError as exc:
        return None, type(exc).__name__


async def _post_within(url: str, body: bytes, headers: dict[str, str], seconds: float) -> int:
    """POST and read the answer within `seconds` in all, whatever the
    receiver does: httpx's timeouts bound each read, so a receiver that
    trickles its answer a byte at a time would outlive the delivery's lease
    (`seconds` + 30) and the attempt would be sent twice. The request is
    cancelled at the deadline (TimeoutError)."""
    async with httpx.AsyncClient(timeout=seconds, follow_redirects=False) as client:
        async with asyncio.timeout(seconds):
            response = await client.post(url, content=body, headers=headers)
            return response.status_code
