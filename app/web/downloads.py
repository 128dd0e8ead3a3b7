"""Answers that carry a message's bytes: an attachment, the raw message.

Shared by the API and the console. Mail is attacker-controlled, so a
download is never rendered by a browser on this origin: `Content-Disposition:
attachment`, `X-Content-Type-Options: nosniff` and a sandboxing
`Content-Security-Policy` on every one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

from fastapi.responses import Response, StreamingResponse

from app.usecases.message_content import AttachmentBody

DOWNLOAD_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "no-store",
}
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]+")


def safe_filename(name: str | None, fallback: str) -> str:
    """A file name to offer: path separators and control characters made
    `_`, at most 200 characters; `fallback` when nothing is left."""
    cleaned = _UNSAFE_NAME.sub("_", name or "").strip().strip(".")
    return cleaned[:200] or fallback


def disposition(filename: str) -> str:
    """`attachment; filename*=UTF-8''…` (RFC 6266 / RFC 5987)."""
    return "attachment; filename*=UTF-8''" + quote(filename, safe="")


def attachment_response(body: AttachmentBody, request_headers: Mapping[str, str]) -> Response:
    """The decoded bytes, streamed, with their type, name and `ETag: "<sha256>"`
    (a matching `If-None-Match` gets 304)."""
    att = body.attachment
    etag = f'"{att.sha256}"'
    headers = {
        **DOWNLOAD_HEADERS,
        "ETag": etag,
        "Content-Disposition": disposition(safe_filename(att.filename, "attachment")),
    }
    if etag in [t.strip() for t in request_headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=headers)
    headers["Content-Length"] = str(att.size)
    return StreamingResponse(body.chunks, media_type=att.content_type, headers=headers)


def raw_response(raw: bytes, message_id: str) -> Response:
    """The message as received, `message/rfc822`."""
    headers = {**DOWNLOAD_HEADERS, "Content-Disposition": disposition(f"{message_id}.eml")}
    return Response(raw, media_type="message/rfc822", headers=headers)
