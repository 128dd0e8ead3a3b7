"""Dead-letter triage: list, show, redrive, discard — one by one or in bulk.

Tenants act in their own namespace; operators in every namespace (the
`namespace` filter narrows it).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from app import triage
from app.api.deps import Caller
from app.api.routes.triage import responses
from app.inputs import Discard, Redrive
from app.triage import BulkDiscard, BulkRedrive, DeadLetterFilter

router = APIRouter(prefix="/v1/dead-letters")


@router.get("", responses=responses(401, 422))
def list_dead_letters(
    caller: Caller,
    filters: Annotated[DeadLetterFilter, Depends()],
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> dict[str, Any]:
    items, next_cursor = triage.dead_letter_list(caller, filters, limit=limit, cursor=cursor)
    return {"items": items, "next_cursor": next_cursor}


@router.post("/redrive", responses=responses(401, 413, 422))
def redrive_many(body: BulkRedrive, caller: Caller) -> dict[str, Any]:
    """Redrive up to `limit` open dead letters matching `filter`."""
    return triage.dead_letters_redrive(caller, body)


@router.post("/discard", responses=responses(401, 413, 422))
def discard_many(body: BulkDiscard, caller: Caller) -> dict[str, Any]:
    """Discard up to `limit` open dead letters matching `filter`, with `note`."""
    return triage.dead_letters_discard(caller, body)


@router.get("/{dead_letter_id}", responses=responses(401, 404))
def get_dead_letter(dead_letter_id: str, caller: Caller) -> dict[str, Any]:
    return triage.dead_letter_read(caller, dead_letter_id)


@router.post("/{dead_letter_id}/redrive", responses=responses(401, 404, 409, 413, 422))
def redrive(dead_letter_id: str, caller: Caller, body: Redrive | None = None) -> dict[str, Any]:
    return triage.dead_letter_redrive(caller, dead_letter_id, body or Redrive())


@router.post("/{dead_letter_id}/discard", responses=responses(401, 404, 409, 413, 422))
def discard(dead_letter_id: str, body: Discard, caller: Caller) -> dict[str, Any]:
    return triage.dead_letter_discard(caller, dead_letter_id, body)
