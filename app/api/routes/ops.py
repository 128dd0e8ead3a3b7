"""Operations, no token: liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.observability import health
from app.observability.exposition import render_metrics

router = APIRouter()


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    failing = await run_in_threadpool(health.failing_dependencies, request.app.state.settings)
    if failing:
        return JSONResponse({"status": "unavailable", "failing": failing}, status_code=503)
    return JSONResponse({"status": "ready", "failing": []})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    body, content_type = await run_in_threadpool(render_metrics, request.app.state.settings)
    return Response(body, media_type=content_type)
