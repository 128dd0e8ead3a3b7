"""Mailpit's API (`/api/v1/…`, `/view/…`) over the inbox, for tests written
against Mailpit's clients (`mailpit-api`, `cypress-mailpit`).

Authentication: HTTP Basic with any user name and a namespace's API token as
the password, or `Authorization: Bearer <token>`. Every answer holds only
that namespace's messages; operators get 403. Routes Signalbox does not offer
answer 501 naming the Signalbox equivalent."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from app.api.responses import errors
from app.errors import InvalidInput, OpsForbidden, Unauthorized
from app.settings import Settings
from app.usecases import mailpit
from app.usecases.auth import TooManyFailures, failure_record, principal_for_token
from app.web.downloads import DOWNLOAD_HEADERS, attachment_response

router = APIRouter(tags=["mailpit"])

MailpitId = Annotated[
    str, Path(alias="ID", pattern=r"^(latest|msg_[A-Za-z0-9]{1,60})$", max_length=64)
]
PartId = Annotated[str, Path(alias="PartID", max_length=64)]
Start = Annotated[int, Query(ge=0, le=mailpit.MAX_OFFSET)]
PageLimit = Annotated[int, Query(ge=1, le=1000)]
SearchQuery = Annotated[str, Query(max_length=1000)]
_ERRORS = errors(401, 403, 404, 422)
_OK = "ok"


class BasicUnauthorized(Unauthorized):
    default_message = (
        "Basic auth with an API token as the password (or a bearer token) is required."
    )


def _token(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip() or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return None


async def mailpit_namespace(request: Request) -> str:
    """The namespace of the Basic password or bearer token; 401 otherwise."""
    settings: Settings = request.app.state.settings
    token = _token(request.headers.get("authorization", ""))
    found = await run_in_threadpool(principal_for_token, settings, token) if token else None
    if found is None:
        address = request.client.host if request.client else "unknown"
        if token:
            wait = await run_in_threadpool(failure_record, settings, address)
            if wait is not None:
                raise TooManyFailures(retry_after_seconds=wait)
        raise BasicUnauthorized()
    if found.namespace is None:
        raise OpsForbidden()
    return found.namespace


Tenant = Annotated[str, Depends(mailpit_namespace)]
_ID = re.compile(r"(latest|msg_[A-Za-z0-9]{1,60})")


def _check_ids(ids: object) -> None:
    """`IDs` of a body: a list of message ids (at most 1,000), else 422."""
    if ids is None:
        return
    if (
        not isinstance(ids, list)
        or len(ids) > 1000
        or not all(isinstance(i, str) and _ID.fullmatch(i) for i in ids)
    ):
        raise InvalidInput("IDs is a list of at most 1000 message ids", field="IDs")


@router.get("/api/v1/messages", responses=_ERRORS)
def list_messages(namespace: Tenant, start: Start = 0, limit: PageLimit = 50) -> JSONResponse:
    """Mailpit: the namespace's messages, newest first."""
    return JSONResponse(mailpit.messages(namespace, query=None, start=start, limit=limit))


@router.get("/api/v1/search", responses=_ERRORS)
def search(
    namespace: Tenant, query: SearchQuery = "", start: Start = 0, limit: PageLimit = 50
) -> JSONResponse:
    """Mailpit: the messages matching `query` (docs/api.md, search)."""
    return JSONResponse(mailpit.messages(namespace, query=query, start=start, limit=limit))


@router.delete("/api/v1/search", response_class=PlainTextResponse, responses=_ERRORS)
def delete_by_search(namespace: Tenant, query: SearchQuery) -> PlainTextResponse:
    """Mailpit: purge the content of the namespace's own messages matching `query`."""
    mailpit.delete(namespace, None, query)
    return PlainTextResponse(_OK)


@router.put("/api/v1/messages", response_class=PlainTextResponse, responses=_ERRORS)
def set_read(
    namespace: Tenant, body: Annotated[dict[str, Any] | None, Body()] = None
) -> PlainTextResponse:
    """Mailpit: `{"IDs": […], "Read": bool}` or `{"Search": "…", "Read": bool}` (none: all)."""
    body = body or {}
    ids, search_text = body.get("IDs"), body.get("Search")
    _check_ids(ids)
    mailpit.set_read(
        namespace,
        ids,
        search_text if isinstance(search_text, str) else None,
        bool(body.get("Read", False)),
    )
    return PlainTextResponse(_OK)


@router.delete("/api/v1/messages", response_class=PlainTextResponse, responses=_ERRORS)
def delete_messages(
    namespace: Tenant, body: Annotated[dict[str, Any] | None, Body()] = None
) -> PlainTextResponse:
    """Mailpit: `{"IDs": […]}`, or every message of the namespace's own."""
    ids = (body or {}).get("IDs")
    _check_ids(ids)
    mailpit.delete(namespace, ids or None)
    return PlainTextResponse(_OK)


@router.get("/api/v1/message/{ID}", responses=_ERRORS)
def message_summary(message_id: MailpitId, namespace: Tenant) -> JSONResponse:
    """Mailpit: one message (`latest`: the newest); marks it read."""
    return JSONResponse(mailpit.summary(namespace, message_id))


@router.get("/api/v1/message/{ID}/headers", responses=_ERRORS)
def message_headers(message_id: MailpitId, namespace: Tenant) -> JSONResponse:
    """Mailpit: each header name → its values."""
    return JSONResponse(mailpit.headers(namespace, message_id))


@router.get("/api/v1/message/{ID}/raw", response_class=PlainTextResponse, responses=_ERRORS)
def message_raw(message_id: MailpitId, namespace: Tenant) -> Response:
    """Mailpit: the message's bytes as received (`text/plain`)."""
    loaded = mailpit.raw(namespace, message_id)
    return Response(loaded.raw, media_type="text/plain; charset=utf-8", headers=DOWNLOAD_HEADERS)


@router.get("/api/v1/message/{ID}/part/{PartID}", response_class=Response, responses=_ERRORS)
def message_part(
    message_id: MailpitId, part_id: PartId, namespace: Tenant, request: Request
) -> Response:
    """Mailpit: an attachment's decoded bytes (`PartID` is its `attachment_id`)."""
    return attachment_response(mailpit.part(namespace, message_id, part_id), request.headers)


@router.get("/view/{ID}.html", response_class=Response, responses=_ERRORS)
def view_html(message_id: MailpitId, namespace: Tenant) -> Response:
    """Mailpit: the HTML part as sent (served sandboxed: no script runs here)."""
    html = mailpit.rendering(namespace, message_id, "html")
    return Response(html, media_type="text/html; charset=utf-8", headers=DOWNLOAD_HEADERS)


@router.get("/view/{ID}.txt", response_class=PlainTextResponse, responses=_ERRORS)
def view_text(message_id: MailpitId, namespace: Tenant) -> PlainTextResponse:
    """Mailpit: the text part as sent."""
    return PlainTextResponse(mailpit.rendering(namespace, message_id, "txt"))


@router.get("/api/v1/info", responses=_ERRORS)
def info(namespace: Tenant) -> JSONResponse:
    """Mailpit: totals of the namespace's messages."""
    return JSONResponse(mailpit.info(namespace))


@router.get("/api/v1/webui", responses=_ERRORS)
def webui(namespace: Tenant) -> JSONResponse:
    """Mailpit: the web UI's configuration (relay, SpamAssassin and chaos: off)."""
    return JSONResponse(mailpit.WEBUI)


@router.get("/api/v1/tags", responses=_ERRORS)
def tags(namespace: Tenant) -> JSONResponse:
    """Mailpit: tags (Signalbox has none: an empty list)."""
    return JSONResponse([])


def _not_offered(feature: str) -> JSONResponse:
    return JSONResponse(
        {
            "error": {
                "code": "not_offered",
                "message": f"Mailpit's {feature} is not offered by Signalbox",
                "equivalent": mailpit.NOT_OFFERED[feature],
            }
        },
        status_code=501,
    )


# Mailpit's routes that Signalbox does not offer: 501 naming the equivalent.
# Left out of the OpenAPI document (they offer nothing); docs/api.md lists them.


def _refusal(path: str, feature: str) -> Callable[..., JSONResponse]:
    """The endpoint of a route not offered: it checks the path's message and
    part ids as the offered routes do, then answers 501."""

    def with_part(message_id: MailpitId, part_id: PartId, namespace: Tenant) -> JSONResponse:
        return _not_offered(feature)

    def with_message(message_id: MailpitId, namespace: Tenant) -> JSONResponse:
        return _not_offered(feature)

    def plain(namespace: Tenant) -> JSONResponse:
        return _not_offered(feature)

    if "{PartID}" in path:
        return with_part
    return with_message if "{ID}" in path else plain


for _method, _path, _feature in (
    ("POST", "/api/v1/send", "send"),
    ("POST", "/api/v1/message/{ID}/release", "release"),
    ("GET", "/api/v1/message/{ID}/html-check", "html-check"),
    ("GET", "/api/v1/message/{ID}/link-check", "link-check"),
    ("GET", "/api/v1/message/{ID}/sa-check", "sa-check"),
    ("GET", "/api/v1/message/{ID}/part/{PartID}/thumb", "thumb"),
    ("GET", "/api/v1/chaos", "chaos"),
    ("PUT", "/api/v1/chaos", "chaos"),
    ("PUT", "/api/v1/tags", "tags"),
    ("PUT", "/api/v1/tags/{tag}", "tags"),  # the tag itself is any string
    ("DELETE", "/api/v1/tags/{tag}", "tags"),
):
    router.add_api_route(
        _path, _refusal(_path, _feature), methods=[_method], include_in_schema=False
    )
