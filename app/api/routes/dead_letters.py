"""Dead-letter triage: list, show, redrive, discard — one by one or in bulk.

Tenants act in their own namespace; operators in every namespace (the
`namespace` filter narrows it), with subjects masked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from app.api.deps import AppSettings, Caller
from app.api.responses import V1, errors
from app.errors import InvalidInput
from app.usecases import triage, views
from app.usecases.auth import Principal
from app.usecases.inputs import Discard, Redrive
from app.usecases.triage import BulkDiscard, BulkRedrive, DeadLetterFilter
from app.web.params import Cursor, DeadLetterId, Limit, NamespaceQuery

router = APIRouter(prefix="/v1/dead-letters")


def _shown(caller: Principal, view: dict[str, Any]) -> dict[str, Any]:
    return views.operator_dead_letter_view(view) if caller.is_ops else view


@router.get("", responses=errors(*V1))
def list_dead_letters(
    caller: Caller,
    filters: Annotated[DeadLetterFilter, Depends()],
    limit: Limit = 50,
    cursor: Cursor = None,
) -> dict[str, Any]:
    items, next_cursor = triage.dead_letter_list(caller, filters, limit=limit, cursor=cursor)
    return {"items": [_shown(caller, i) for i in items], "next_cursor": next_cursor}


@router.get("/causes", responses=errors(*V1))
def dead_letter_causes(
    caller: Caller,
    since: Annotated[datetime | None, Query()] = None,
    namespace: NamespaceQuery = None,
    limit: Limit = 50,
) -> dict[str, Any]:
    """Open dead letters grouped by provider, reason, first near miss's why
    and test case, largest first (operators: every namespace, or `namespace`)."""
    if since is not None and since.tzinfo is None:
        raise InvalidInput("since must carry a timezone, e.g. 2026-01-01T00:00:00Z", field="since")
    items = triage.dead_letter_causes(caller, since=since, namespace=namespace, limit=limit)
    return {"items": items, "next_cursor": None}


@router.post("/redrive", responses=errors(*V1, 429))
def redrive_many(body: BulkRedrive, caller: Caller, settings: AppSettings) -> dict[str, Any]:
    """Redrive up to `limit` open dead letters matching `filter`."""
    return triage.dead_letters_redrive(caller, body, settings.max_waiting_per_namespace)


@router.post("/discard", responses=errors(*V1))
def discard_many(body: BulkDiscard, caller: Caller) -> dict[str, Any]:
    """Discard up to `limit` open dead letters matching `filter`, with `note`."""
    return triage.dead_letters_discard(caller, body)


@router.get("/{dead_letter_id}", responses=errors(*V1, 404))
def get_dead_letter(dead_letter_id: DeadLetterId, caller: Caller) -> dict[str, Any]:
    return _shown(caller, triage.dead_letter_read(caller, dead_letter_id))


@router.post("/{dead_letter_id}/redrive", responses=errors(*V1, 404, 409, 429))
def redrive(
    dead_letter_id: DeadLetterId, caller: Caller, settings: AppSettings, body: Redrive | None = None
) -> dict[str, Any]:
    view = triage.dead_letter_redrive(
        caller, dead_letter_id, body or Redrive(), settings.max_waiting_per_namespace
    )
    return views.operator_view(view) if caller.is_ops else view


@router.post("/{dead_letter_id}/discard", responses=errors(*V1, 404, 409))
def discard(dead_letter_id: DeadLetterId, body: Discard, caller: Caller) -> dict[str, Any]:
    return _shown(caller, triage.dead_letter_discard(caller, dead_letter_id, body))
