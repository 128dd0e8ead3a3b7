"""Triage reads: a signal's checks timeline and a claim read back by its holder."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.api.deps import AppSettings, Caller, Namespace
from app.api.outcomes import claim_response
from app.api.responses import V1, errors
from app.usecases import claims, matches, triage
from app.web.params import ClaimId, Cursor, Limit, SignalId

router = APIRouter(prefix="/v1")


@router.get("/signals/{signal_id}/checks", responses=errors(*V1, 404))
def list_checks(
    signal_id: SignalId,
    caller: Caller,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """The signal's checks, oldest first, across redrives (operators: any namespace)."""
    items, next_cursor = triage.check_list(caller, signal_id, limit=limit, cursor=cursor)
    return {"items": items, "next_cursor": next_cursor}


@router.get("/signals/{signal_id}/matches", responses=errors(*V1, 404))
def list_matches(
    request: Request, signal_id: SignalId, caller: Caller, settings: AppSettings
) -> dict[str, Any]:
    """Every message matching the signal's filters in its window, oldest
    first, with the signal that took it (operators: any namespace, subjects masked)."""
    return matches.match_list(
        settings,
        caller.scope(),
        signal_id,
        masked=caller.is_ops,
        parse=request.app.state.check_runner.parse,
    )


@router.get("/claims/{claim_id}", responses=errors(*V1, 403, 404, state=(410,)))
def read_claim(claim_id: ClaimId, namespace: Namespace) -> JSONResponse:
    """While the claim is active: the claim's 200 body again (content
    included); after it ended: 410 with its status."""
    return claim_response(claims.claim_read(namespace, claim_id))
