"""The sink's store read for one recipient's window at request time
(`GET /v1/signals/{id}/matches`): which of its messages no look has recorded
yet, without their bytes, then one message's bytes at a time."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from app.db import runner
from app.db.records import SinkMessageRow
from app.db.runner import Statement

_UNRECORDED: Statement[SinkMessageRow] = Statement(
    "sink_message_unrecorded_in_window",
    """
    SELECT sm.id, sm.received_at, sm.envelope_recipients, sm.size, sm.message_id
      FROM sink_messages sm
     WHERE sm.all_recipients && ARRAY[CAST(:recipient AS text)]
       AND sm.received_at >= :opens AND sm.received_at <= :closes
       AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.provider = :recorded_by
                          AND m.provider_message_id = CAST(sm.id AS text))
     ORDER BY sm.received_at, sm.id
     LIMIT :limit
    """,
)


def sink_message_unrecorded_in_window(
    session: Connection,
    recipient: str,
    *,
    opens: datetime,
    closes: datetime,
    recorded_by: str,
    limit: int,
) -> list[SinkMessageRow]:
    """Up to `limit` sink messages to `recipient` (envelope, To or Cc) received
    in [opens, closes] that no look of provider `recorded_by` recorded, oldest
    first: id, stamp, envelope, size and the `msg_` id it was stored with,
    never the bytes."""
    return runner.all(
        session,
        _UNRECORDED,
        {
            "recipient": recipient.lower(),
            "opens": opens,
            "closes": closes,
            "recorded_by": recorded_by,
            "limit": limit,
        },
    )


_RAW: Statement[SinkMessageRow] = Statement(
    "sink_message_raw", "SELECT raw FROM sink_messages WHERE id = :id"
)


def sink_message_raw(session: Connection, sink_id: int) -> bytes | None:
    """One sink message's bytes (None when it is gone), in binary format."""
    row = runner.one(session, _RAW, {"id": sink_id}, binary=True)
    return bytes(row["raw"]) if row is not None else None
