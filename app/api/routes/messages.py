"""The whole message of a live claim: its fields, an attachment, the raw bytes
(tenants only: operators get 403; after the claim ended, 410 with its status)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response

from app.api.deps import Namespace
from app.api.outcomes import claim_response
from app.api.responses import V1, errors
from app.domain.whole_message import ATTACHMENT_ID_PATTERN
from app.usecases import message_content
from app.usecases.claim_answers import Answer
from app.web.downloads import attachment_response, raw_response
from app.web.params import ClaimId

router = APIRouter(prefix="/v1")

AttachmentId = Annotated[str, Path(pattern=ATTACHMENT_ID_PATTERN, max_length=64)]
_ERRORS = errors(*V1, 403, 404, state=(410,))
_BYTES = {"description": "The bytes.", "content": {"application/octet-stream": {}}}


def _ended(answer: Answer) -> JSONResponse:
    return claim_response(answer)


@router.get("/claims/{claim_id}/message", response_model=dict[str, Any], responses=_ERRORS)
def read_message(claim_id: ClaimId, namespace: Namespace) -> JSONResponse:
    """Headers, addresses, text, HTML as sent, links, codes, attachments,
    and the raw message's size and SHA-256."""
    return _ended(message_content.claim_message(namespace, claim_id))


@router.get(
    "/claims/{claim_id}/attachments/{attachment_id}",
    response_class=Response,
    responses={200: _BYTES, 304: {"description": "`If-None-Match` matched."}, **_ERRORS},
)
def read_attachment(
    claim_id: ClaimId, attachment_id: AttachmentId, namespace: Namespace, request: Request
) -> Response:
    """One attachment's decoded bytes, with `Content-Type`, `Content-Disposition`
    and `ETag: "<sha256>"`."""
    found = message_content.claim_attachment(namespace, claim_id, attachment_id)
    if isinstance(found, Answer):
        return _ended(found)
    return attachment_response(found, request.headers)


@router.get(
    "/claims/{claim_id}/raw",
    response_class=Response,
    responses={200: {"description": "The message.", "content": {"message/rfc822": {}}}, **_ERRORS},
)
def read_raw(claim_id: ClaimId, namespace: Namespace) -> Response:
    """The message's bytes as received (`message/rfc822`)."""
    found = message_content.claim_raw(namespace, claim_id)
    if isinstance(found, Answer):
        return _ended(found)
    return raw_response(found.raw, found.message_id)
