"""The API's front gate, in pure ASGI: who is calling, and how much they may send.

Runs before routing, so nothing reads a body that it would refuse:
- a `/v1` request without a valid bearer token gets 401 before one byte of its
  body is read (the principal it resolves is kept in `scope["state"]` for the
  route's dependency); once its address has sent too many unknown tokens,
  429 `too_many_failures` with `Retry-After` instead;
- a body over `SIGNALBOX_API_MAX_BODY_BYTES` gets 413 `payload_too_large`:
  at once when `Content-Length` says so, else as soon as the streamed
  (chunked) bytes pass the limit; nothing beyond the limit is buffered;
- console answers carry `Strict-Transport-Security` when its cookies are
  `Secure` (`Settings.console_cookies_secure`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import (
    DATABASE_RETRY_AFTER_SECONDS,
    DATABASE_UNAVAILABLE,
    DATABASE_UNAVAILABLE_MESSAGE,
)
from app.settings import Settings
from app.usecases.auth import (
    TooManyFailures,
    failure_record,
    known_principal,
    principal_for_token,
)

PROTECTED_PREFIX = "/v1"
CONSOLE_PREFIX = "/console"
HSTS = b"max-age=31536000"


class PayloadTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes the limit mid-request."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


async def _respond(
    send: Send,
    scope: Scope,
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if _has_body(scope):
        # The body stays unread: the connection cannot carry another request.
        raw_headers.append((b"connection", b"close"))
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    return _header(scope, b"transfer-encoding") is not None or length not in (None, "0")


def client_address(scope: Scope) -> str:
    """The client's address as uvicorn gives it (X-Forwarded-For is believed
    from SIGNALBOX_TRUSTED_PROXIES only: app/cli/serve.py)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


Refusal = Callable[[Send, Scope], Awaitable[None]]


def _refusal(status: int, code: str, message: str, headers: dict[str, str]) -> Refusal:
    async def answer(send: Send, scope: Scope) -> None:
        await _respond(send, scope, status, code, message, headers)

    return answer


_unauthorized = _refusal(
    401,
    "unauthorized",
    "A valid bearer token is required (Authorization: Bearer <token>).",
    {"WWW-Authenticate": "Bearer"},
)


def _too_many_failures(wait: float) -> Refusal:
    return _refusal(
        429,
        TooManyFailures.code,
        TooManyFailures.default_message,
        {"Retry-After": str(max(1, math.ceil(wait)))},
    )


_database_unavailable = _refusal(
    503,
    "database_unavailable",
    DATABASE_UNAVAILABLE_MESSAGE,
    {"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
)


def _is_protected(path: str) -> bool:
    return path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")


class GateMiddleware:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.max_body = settings.api_max_body_bytes
        # The console's cookies are Secure: browsers should only come back over HTTPS.
        self.console_hsts = settings.console_cookies_secure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _is_protected(scope.get("path", "")):
            try:
                refused = await self._authenticate(scope)
            except DATABASE_UNAVAILABLE:  # a token looked up in a database that is away
                refused = _database_unavailable
            if refused is not None:
                await refused(send, scope)
                return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_body
            except ValueError:
                too_large = False  # the server rejects a malformed length itself
            if too_large:
                await self._too_large(scope, send)
                return
        started = False

        hsts = self.console_hsts and scope.get("path", "").startswith(CONSOLE_PREFIX)

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if hsts:
                    headers = list(message.get("headers", ()))
                    headers.append((b"strict-transport-security", HSTS))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, self._counting(receive), send_tracking)
        except PayloadTooLarge:
            # Only reaches here if a reader outside the routes' error handling
            # (e.g. another middleware) hit the limit.
            if started:
                raise
            await self._too_large(scope, send)

    async def _authenticate(self, scope: Scope) -> Refusal | None:
        """None when the bearer token is valid (its principal kept in the
        scope's state); else the answer: 401, or 429 once this address has
        sent too many unknown tokens."""
        header = _header(scope, b"authorization") or ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized
        found = known_principal(self.settings, token) or await anyio.to_thread.run_sync(
            principal_for_token, self.settings, token
        )
        if found is None:
            wait = await anyio.to_thread.run_sync(
                failure_record, self.settings, client_address(scope)
            )
            return _unauthorized if wait is None else _too_many_failures(wait)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["principal"] = found
        return None

    def _counting(self, receive: Receive) -> Receive:
        seen = 0
        limit = self.max_body

        async def receive_counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(limit)
            return message

        return receive_counted

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await _respond(
            send,
            scope,
            413,
            "payload_too_large",
            f"The request body is larger than {self.max_body} bytes "
            "(SIGNALBOX_API_MAX_BODY_BYTES).",
        )
