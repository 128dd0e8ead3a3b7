"""Request dependencies: settings and bearer-token authentication."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from app.db import repository as repo
from app.db.engine import transaction
from app.domain.ids import token_hash
from app.errors import SignalboxError
from app.settings import Settings


class Unauthorized(SignalboxError):
    code = "unauthorized"
    status_code = 401
    default_message = "A valid bearer token is required (Authorization: Bearer <token>)."


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _namespace_of(settings: Settings, token: str) -> str | None:
    namespace = settings.token_map.get(token)
    if namespace is not None:
        return namespace
    with transaction() as session:
        return repo.token_namespace(session, token_hash(token))


async def namespace(
    request: Request, settings: Annotated[Settings, Depends(get_app_settings)]
) -> str:
    """The caller's namespace, from `Authorization: Bearer <token>`; else 401."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized()
    found = await run_in_threadpool(_namespace_of, settings, token.strip())
    if found is None:
        raise Unauthorized("The bearer token is not valid.")
    return found


Namespace = Annotated[str, Depends(namespace)]
AppSettings = Annotated[Settings, Depends(get_app_settings)]
