"""Dead-letter triage: list, show, redrive, discard."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter

from app import expiry
from app.api.deps import Namespace
from app.api.params import Cursor, DeadLetterId, Limit, ProviderQuery
from app.inputs import Discard, Redrive

router = APIRouter(prefix="/v1/dead-letters")

State = Literal["open", "redriven", "discarded"]
Reason = Literal["deadline", "check_budget", "provider_errors", "claims_exhausted"]


@router.get("")
def list_dead_letters(
    namespace: Namespace,
    state: State | None = None,
    reason: Reason | None = None,
    provider: ProviderQuery = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> dict[str, Any]:
    items, next_cursor = expiry.dead_letter_list(
        namespace, state=state, reason=reason, provider=provider, limit=limit, cursor=cursor
    )
    return {"items": items, "next_cursor": next_cursor}


@router.get("/{dead_letter_id}")
def get_dead_letter(dead_letter_id: DeadLetterId, namespace: Namespace) -> dict[str, Any]:
    return expiry.dead_letter_read(namespace, dead_letter_id)


@router.post("/{dead_letter_id}/redrive")
def redrive(
    dead_letter_id: DeadLetterId, namespace: Namespace, body: Redrive | None = None
) -> dict[str, Any]:
    return expiry.dead_letter_redrive(namespace, dead_letter_id, body or Redrive())


@router.post("/{dead_letter_id}/discard")
def discard(dead_letter_id: DeadLetterId, body: Discard, namespace: Namespace) -> dict[str, Any]:
    return expiry.dead_letter_discard(namespace, dead_letter_id, body)
