"""Dead-letter triage: list, show, redrive, discard.

Tenants see their own namespace; operators every namespace (`?namespace=`
filters) with subjects masked.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter

from app import expiry, views
from app.api.deps import Caller
from app.api.params import Cursor, DeadLetterId, Limit, NamespaceQuery, ProviderQuery
from app.api.responses import V1, errors
from app.auth import Principal
from app.inputs import Discard, Redrive

router = APIRouter(prefix="/v1/dead-letters")

State = Literal["open", "redriven", "discarded"]
Reason = Literal["deadline", "check_budget", "provider_errors", "claims_exhausted"]


def _shown(caller: Principal, view: dict[str, Any]) -> dict[str, Any]:
    return views.operator_dead_letter_view(view) if caller.is_ops else view


@router.get("", responses=errors(*V1))
def list_dead_letters(
    caller: Caller,
    state: State | None = None,
    reason: Reason | None = None,
    provider: ProviderQuery = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    namespace: NamespaceQuery = None,
) -> dict[str, Any]:
    items, next_cursor = expiry.dead_letter_list(
        caller.scope(namespace),
        state=state,
        reason=reason,
        provider=provider,
        limit=limit,
        cursor=cursor,
    )
    return {"items": [_shown(caller, i) for i in items], "next_cursor": next_cursor}


@router.get("/{dead_letter_id}", responses=errors(*V1, 404))
def get_dead_letter(dead_letter_id: DeadLetterId, caller: Caller) -> dict[str, Any]:
    return _shown(caller, expiry.dead_letter_read(caller.scope(), dead_letter_id))


@router.post("/{dead_letter_id}/redrive", responses=errors(*V1, 404, 409))
def redrive(
    dead_letter_id: DeadLetterId, caller: Caller, body: Redrive | None = None
) -> dict[str, Any]:
    view = expiry.dead_letter_redrive(caller.scope(), dead_letter_id, body or Redrive())
    return views.operator_view(view) if caller.is_ops else view


@router.post("/{dead_letter_id}/discard", responses=errors(*V1, 404, 409))
def discard(dead_letter_id: DeadLetterId, body: Discard, caller: Caller) -> dict[str, Any]:
    return _shown(caller, expiry.dead_letter_discard(caller.scope(), dead_letter_id, body))
