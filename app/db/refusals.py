"""Repository of the sink's refused deliveries (`smtp_refusals`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.records import RefusalRow
from app.db.runner import Statement

# The attempts travel as one JSON array: one statement for any number of them.
_RECORD: Statement = Statement(
    "smtp_refusal_record_many",
    """
    INSERT INTO smtp_refusals (recipients, code, reason, detail, auth_namespace)
    SELECT ARRAY(SELECT jsonb_array_elements_text(e->'r')), (e->>'c')::int, e->>'w',
           e->>'d', e->>'a'
      FROM jsonb_array_elements(CAST(:items AS jsonb)) AS e
    """,
)


def smtp_refusal_record_many(session: Connection, items: Sequence[dict[str, Any]]) -> int:
    """Record refused attempts, each `{recipients, code, reason, detail,
    auth_namespace}` (recipients lower-cased by the caller); how many."""
    if not items:
        return 0
    payload = [
        {
            "r": list(i["recipients"]),
            "c": int(i["code"]),
            "w": i["reason"],
            "d": i["detail"],
            "a": i.get("auth_namespace"),
        }
        for i in items
    ]
    return runner.exec(session, _RECORD, {"items": json.dumps(payload)})


# The refusals of a recipient's window, and those of the same window refused
# before any recipient was named; never another namespace's authenticated ones.
_FOR_WINDOW: Statement[RefusalRow] = Statement(
    "smtp_refusal_in_window",
    """
    (SELECT refused_at, code, reason, detail, recipients FROM smtp_refusals
      WHERE recipients && ARRAY[CAST(:rcpt AS text)]
        AND refused_at >= :since AND refused_at <= :until
        AND (auth_namespace IS NULL OR auth_namespace = :ns)
      ORDER BY refused_at DESC LIMIT :limit)
    UNION ALL
    (SELECT refused_at, code, reason, detail, recipients FROM smtp_refusals
      WHERE recipients = '{}'
        AND refused_at >= :since AND refused_at <= :until
        AND (auth_namespace IS NULL OR auth_namespace = :ns)
      ORDER BY refused_at DESC LIMIT :limit)
    """,
)


def smtp_refusal_in_window(
    session: Connection,
    recipient: str,
    *,
    namespace: str,
    since: datetime,
    until: datetime,
    limit: int = 20,
) -> list[RefusalRow]:
    """The latest `limit` refusals of deliveries to `recipient` between `since`
    and `until`, and the latest `limit` refused before any recipient was named."""
    return runner.all(
        session,
        _FOR_WINDOW,
        {
            "rcpt": recipient.lower(),
            "ns": namespace,
            "since": since,
            "until": until,
            "limit": limit,
        },
    )
