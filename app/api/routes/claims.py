"""Claims: claim, consume, release, extend (tenants only: operators get 403)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import Namespace
from app.api.outcomes import claim_response
from app.api.responses import V1, StateBody, errors
from app.usecases import claims
from app.usecases.inputs import ClaimCreate, ClaimExtend
from app.web.params import ClaimId, SignalId

router = APIRouter(prefix="/v1")

_Route = TypeVar("_Route", bound=Callable[..., Any])

# The routes answer the use cases' views, already JSON, as a JSONResponse:
# FastAPI would otherwise validate a `dict[str, Any]` answer against itself
# in a second thread hop and encode it again. `response_model` keeps the
# OpenAPI document as it was.


def _claim_action(action: str) -> Callable[[_Route], _Route]:
    """The route `POST /v1/claims/{claim_id}/<action>`, answering the claim's view."""
    return router.post(
        f"/claims/{{claim_id}}/{action}",
        response_model=dict[str, Any],
        responses=errors(*V1, 403, 404, 409),
    )


@router.post(
    "/signals/{signal_id}/claim",
    responses={
        202: {"model": StateBody, "description": "No message yet: `waiting`."},
        **errors(*V1, 403, 404, 409, 410, state=(409, 410)),
    },
)
def claim_signal(signal_id: SignalId, body: ClaimCreate, namespace: Namespace) -> JSONResponse:
    return claim_response(claims.claim(namespace, signal_id, body))


@_claim_action("consume")
def consume_claim(claim_id: ClaimId, namespace: Namespace) -> JSONResponse:
    return JSONResponse(claims.consume(namespace, claim_id))


@_claim_action("release")
def release_claim(claim_id: ClaimId, namespace: Namespace) -> JSONResponse:
    return JSONResponse(claims.release(namespace, claim_id))


@_claim_action("extend")
def extend_claim(claim_id: ClaimId, body: ClaimExtend, namespace: Namespace) -> JSONResponse:
    return JSONResponse(claims.extend(namespace, claim_id, body))
