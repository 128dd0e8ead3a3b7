"""Questions for the database server itself rather than a table."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text


def db_now(session: Connection) -> datetime:
    """The server's clock: the authority for every timestamp."""
    return session.execute(text("SELECT clock_timestamp()")).scalar_one()


def db_oldest_transaction_age(session: Connection) -> float:
    """Seconds the oldest transaction open on this database has been open (any
    client but this session; 0 when none). One left idle pins the xmin horizon:
    VACUUM keeps every row version newer than it."""
    age = session.execute(
        text(
            "SELECT extract(epoch FROM max(clock_timestamp() - xact_start))"
            " FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        )
    ).scalar_one_or_none()
    return float(age or 0.0)


def ping(session: Connection) -> None:
    """One round trip: the session's connection is open and answers."""
    session.execute(text("SELECT 1"))
