"""Request dependencies: settings and bearer-token authentication."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from app.errors import OpsForbidden, Unauthorized
from app.settings import Settings
from app.usecases.auth import (
    Principal,
    TooManyFailures,
    failure_record,
    known_principal,
    principal_for_token,
)


async def get_app_settings(request: Request) -> Settings:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a
    # thread hop per request for an attribute read.
    settings: Settings = request.app.state.settings
    return settings


async def principal(request: Request) -> Principal:
    """The caller, from `Authorization: Bearer <token>`; else 401 (429
    `too_many_failures` once the address has sent too many unknown tokens).

    Each dependency costs FastAPI a resolution per request: the settings are
    read here, not depended on, and `namespace` calls this directly."""
    known = getattr(request.state, "principal", None)
    if isinstance(known, Principal):  # resolved earlier in this request
        return known
    settings: Settings = request.app.state.settings
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized()
    found = known_principal(settings, token) or await run_in_threadpool(
        principal_for_token, settings, token
    )
    if found is None:
        address = request.client.host if request.client else "unknown"
        wait = await run_in_threadpool(failure_record, settings, address)
        if wait is not None:
            raise TooManyFailures(retry_after_seconds=wait)
        raise Unauthorized("The bearer token is not valid.")
    request.state.principal = found
    return found


async def namespace(request: Request) -> str:
    """The caller's namespace: routes that act on content take tenants only (ops: 403)."""
    caller = await principal(request)
    if caller.namespace is None:
        raise OpsForbidden()
    return caller.namespace


Caller = Annotated[Principal, Depends(principal)]
Namespace = Annotated[str, Depends(namespace)]
AppSettings = Annotated[Settings, Depends(get_app_settings)]
