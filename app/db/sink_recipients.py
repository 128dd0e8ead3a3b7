"""Repository: widen a stored sink message's recipients once its headers are parsed.

Kept apart from ``app/db/messages.py`` (where ``sink_message_store`` lives) only
to keep a parallel change set separate; it belongs next to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.db.repository import affected


def sink_message_add_recipients(session: Session, sink_id: int, recipients: Sequence[str]) -> int:
    """Add ``recipients`` (lower-cased) to ``all_recipients`` of one sink message,
    sorted and without repeats; returns 1 when the row exists, else 0."""
    return affected(
        session.execute(
            text(
                """
                UPDATE sink_messages
                   SET all_recipients = ARRAY(
                         SELECT DISTINCT r
                           FROM unnest(all_recipients || CAST(:rcpts AS text[])) AS r
                          ORDER BY r)
                 WHERE id = :id
                """
            ),
            {"id": sink_id, "rcpts": sorted({r.lower() for r in recipients})},
        )
    )
