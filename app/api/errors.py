"""Errors in the contract's shape: `{"error": {"code", "message"}}`."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import Conflict, InvalidInput, SignalboxError

log = logging.getLogger("signalbox.api")


# The database could not serve the request: no connection to be had (its
# max_connections reached, this process's pool exhausted past its timeout,
# the server restarting), or a statement it aborted (a lock or statement
# timeout, a deadlock). Nothing was committed: the caller may retry.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError, PoolTimeout)
DATABASE_RETRY_AFTER_SECONDS = 1
DATABASE_UNAVAILABLE_MESSAGE = "the database is unavailable or out of connections; retry shortly"


def database_unavailable() -> JSONResponse:
    """503 `database_unavailable` with Retry-After: never a 500 for a
    database that is busy or away (docs/api.md, "Errors")."""
    return JSONResponse(
        error_body("database_unavailable", DATABASE_UNAVAILABLE_MESSAGE),
        status_code=503,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
    )


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def _field_of(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(SignalboxError)
    async def _signalbox_error(request: Request, exc: SignalboxError) -> JSONResponse:
        extra: dict[str, Any] = {k: v for k, v in exc.details.items() if v is not None}
        body = error_body(exc.code, exc.message, **extra)
        if isinstance(exc, Conflict):
            body["status"] = exc.code
        if isinstance(exc, InvalidInput) and exc.field:
            body["error"]["field"] = exc.field
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else {}
        retry_after = getattr(exc, "retry_after_seconds", None)
        if retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
        return JSONResponse(body, status_code=exc.status_code, headers=headers)

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        log.warning(
            "database unavailable; answered 503",
            exc_info=exc,
            extra={"event": "database_unavailable", "path": request.url.path},
        )
        return database_unavailable()

    for kind in DATABASE_UNAVAILABLE:
        app.add_exception_handler(kind, _database)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        fields = [
            {"field": _field_of(tuple(e.get("loc", ()))), "message": e.get("msg", "invalid")}
            for e in errors
        ]
        first = fields[0] if fields else {"field": "body", "message": "invalid"}
        if errors and errors[0].get("type") == "json_invalid":
            first = {"field": "body", "message": "the body is not valid JSON"}
        return JSONResponse(
            error_body(
                "invalid_input",
                f"{first['field']}: {first['message']}",
                field=first["field"],
                fields=fields,
            ),
            status_code=422,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode (not UTF-8, …): the
            # contract's answer to invalid JSON is 422 naming the body.
            return JSONResponse(
                error_body("invalid_input", "body: the body is not valid JSON", field="body"),
                status_code=422,
            )
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(
            error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
        )
