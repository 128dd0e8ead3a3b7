"""Use cases of the sink's refused deliveries: record them, and find the one
a dead letter names (`app.domain.refusals`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from app.db import refusals as refusals_db
from app.db.engine import autocommit
from app.domain.refusals import DETAIL_MAX, Refusal, most_telling
from app.infra.keys import recipient_hash
from app.observability.logs import refused_extra
from app.settings import Settings

log = logging.getLogger("signalbox.sink")


def refusal_item(
    code: int,
    reason: str,
    detail: str,
    recipients: Sequence[str] = (),
    auth_namespace: str | None = None,
) -> dict[str, Any]:
    """One refused attempt as `record_many` takes it (no content, no credentials)."""
    return {
        "recipients": sorted({r.strip().lower() for r in recipients if r.strip()}),
        "code": int(code),
        "reason": reason,
        "detail": "".join(ch for ch in detail if ch.isprintable())[:DETAIL_MAX],
        "auth_namespace": auth_namespace,
    }


def record_many(settings: Settings, items: Sequence[Mapping[str, Any]]) -> list[None]:
    """Record refused attempts in one statement (its own transaction) and log
    each with its recipients' hashes. One None per item."""
    with autocommit() as session:
        refusals_db.smtp_refusal_record_many(session, [dict(i) for i in items])
    for item in items:
        hashes = [recipient_hash(r, settings) for r in item["recipients"]]
        log.info("delivery refused", extra=refused_extra(item["reason"], item["code"], hashes))
    return [None] * len(items)


def refusal_for_signal(session: Connection, signal: Mapping[str, Any]) -> Refusal | None:
    """The refusal an expired signal's recommendation names (None: none):
    of a delivery to its recipient within its window, else one refused before
    any recipient was named; another namespace's authenticated ones never."""
    until = signal.get("expires_at") or datetime.now(UTC)
    rows = refusals_db.smtp_refusal_in_window(
        session,
        str(signal["recipient"]),
        namespace=str(signal["namespace"]),
        since=signal["received_after"],
        until=until,
    )
    refusals = [
        Refusal(
            refused_at=r["refused_at"],
            code=int(r["code"]),
            reason=str(r["reason"]),
            detail=str(r["detail"] or ""),
            recipients=tuple(r["recipients"] or ()),
        )
        for r in rows
    ]
    return most_telling(refusals, str(signal["recipient"]))
