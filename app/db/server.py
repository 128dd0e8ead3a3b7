"""Questions for the database server itself rather than a table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text


def db_now(session: Connection) -> datetime:
    """The server's clock: the authority for every timestamp."""
    return session.execute(text("SELECT clock_timestamp()")).scalar_one()


def ping(session: Connection) -> None:
    """One round trip: the session's connection is open and answers."""
    session.execute(text("SELECT 1"))
