"""Chaos on the sink: a namespace's rules for its own addresses (tenants only)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import AppSettings, Namespace
from app.api.responses import V1, errors
from app.usecases import chaos
from app.usecases.chaos import ChaosPut

router = APIRouter(prefix="/v1/chaos")


@router.put("", responses=errors(*V1, 403))
def put_chaos(body: ChaosPut, namespace: Namespace, settings: AppSettings) -> dict[str, Any]:
    """Replace the namespace's chaos rules; the answer lists them with `applied`."""
    return chaos.chaos_put(settings, namespace, body)


@router.get("", responses=errors(*V1, 403))
def get_chaos(namespace: Namespace) -> dict[str, Any]:
    """The namespace's rules that have not ended, with how often each applied."""
    return chaos.chaos_get(namespace)


@router.delete("", responses=errors(*V1, 403))
def delete_chaos(namespace: Namespace, settings: AppSettings) -> dict[str, Any]:
    """End every rule of the namespace; `deleted` lists them with their counts."""
    return chaos.chaos_delete(settings, namespace)
