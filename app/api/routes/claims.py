"""Claims: claim, consume, release, extend."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app import claims
from app.api.deps import Namespace
from app.api.params import ClaimId, SignalId
from app.inputs import ClaimCreate, ClaimExtend

router = APIRouter(prefix="/v1")


@router.post("/signals/{signal_id}/claim")
def claim_signal(signal_id: SignalId, body: ClaimCreate, namespace: Namespace) -> JSONResponse:
    answer = claims.claim(namespace, signal_id, body)
    return JSONResponse(answer.body, status_code=answer.status_code)


@router.post("/claims/{claim_id}/consume")
def consume_claim(claim_id: ClaimId, namespace: Namespace) -> dict[str, Any]:
    return claims.consume(namespace, claim_id)


@router.post("/claims/{claim_id}/release")
def release_claim(claim_id: ClaimId, namespace: Namespace) -> dict[str, Any]:
    return claims.release(namespace, claim_id)


@router.post("/claims/{claim_id}/extend")
def extend_claim(claim_id: ClaimId, body: ClaimExtend, namespace: Namespace) -> dict[str, Any]:
    return claims.extend(namespace, claim_id, body)
