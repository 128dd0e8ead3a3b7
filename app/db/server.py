"""Questions for the database server itself rather than a table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from app.db import runner
from app.db.runner import Statement

_NOW: Statement = Statement("db_now", "SELECT clock_timestamp()")
_PING: Statement = Statement("db_ping", "SELECT 1")


def db_now(session: Connection) -> datetime:
    """The server's clock: the authority for every timestamp."""
    row = runner.one(session, _NOW)
    assert row is not None
    now: datetime = row["clock_timestamp"]
    return now


def ping(session: Connection) -> None:
    """One round trip: the session's connection is open and answers."""
    runner.exec(session, _PING)
