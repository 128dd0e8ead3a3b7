"""Triage reads: a signal's checks timeline and a claim read back by its holder."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from app import claims, triage
from app.api.deps import Caller, Namespace

router = APIRouter(prefix="/v1")

_DESCRIPTIONS = {
    200: "Success",
    401: "No valid bearer token (`unauthorized`)",
    403: "An operator token on a tenant-only route (`ops_forbidden`)",
    404: "No such object in the caller's namespace (`not_found`)",
    409: "The object is not in a state that allows this (`dead_letter_not_open`, …)",
    410: "The claim ended: `status` says how (`consumed`, `released`, `lapsed`)",
    413: "The body is larger than SIGNALBOX_API_MAX_BODY_BYTES (`payload_too_large`)",
    422: "Invalid input; `error.field` names the field (`invalid_input`)",
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the statuses a route answers besides its 200."""
    return {code: {"description": _DESCRIPTIONS[code]} for code in codes}


@router.get("/signals/{signal_id}/checks", responses=responses(401, 404, 422))
def list_checks(
    signal_id: str,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    """The signal's checks, oldest first, across redrives (operators: any namespace)."""
    items, next_cursor = triage.check_list(caller, signal_id, limit=limit, cursor=cursor)
    return {"items": items, "next_cursor": next_cursor}


@router.get("/claims/{claim_id}", responses=responses(401, 403, 404, 410))
def read_claim(claim_id: str, namespace: Namespace) -> JSONResponse:
    """While the claim is active: the claim's 200 body again (content
    included); after it ended: 410 with its status."""
    answer = claims.claim_read(namespace, claim_id)
    return JSONResponse(answer.body, status_code=answer.status_code)
