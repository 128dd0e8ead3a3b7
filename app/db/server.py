"""Questions for the database server itself rather than a table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from app.db import runner
from app.db.runner import Statement

_NOW: Statement = Statement("db_now", "SELECT clock_timestamp()")
_PING: Statement = Statement("db_ping", "SELECT 1")
_OLDEST_TRANSACTION_AGE: Statement = Statement(
    "db_oldest_transaction_age",
    "SELECT extract(epoch FROM max(clock_timestamp() - xact_start))"
    " FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
)


def db_now(session: Connection) -> datetime:
    """The server's clock: the authority for every timestamp."""
    row = runner.one(session, _NOW)
    assert row is not None
    now: datetime = row["clock_timestamp"]
    return now


def db_oldest_transaction_age(session: Connection) -> float:
    """Seconds the oldest transaction open on this database has been open (any
    client but this session; 0 when none). One left idle pins the xmin horizon:
    VACUUM keeps every row version newer than it."""
    row = runner.one(session, _OLDEST_TRANSACTION_AGE)
    return float((row and row["extract"]) or 0.0)


def ping(session: Connection) -> None:
    """One round trip: the session's connection is open and answers."""
    runner.exec(session, _PING)
