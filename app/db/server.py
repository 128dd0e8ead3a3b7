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
    "SELECT extract(epoch FROM max(clock_timestamp() - xact_start)) AS age"
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
    return float((row and row["age"]) or 0.0)


# Connection slots a new connection of this session's role could still take:
# the server's (max_connections less the client backends, less the slots
# reserved for superusers and for pg_use_reserved_connections unless the role
# is a superuser) and the role's own CONNECTION LIMIT, the smaller of the two.
_CONNECTION_ROOM: Statement = Statement(
    "db_connection_room",
    """
    SELECT least(
               current_setting('max_connections')::int - used.server
               - CASE WHEN r.rolsuper THEN 0 ELSE
                   current_setting('superuser_reserved_connections')::int
                   + coalesce((SELECT setting::int FROM pg_settings
                                WHERE name = 'reserved_connections'), 0) END,
               CASE WHEN r.rolconnlimit < 0 THEN 2147483647
                    ELSE r.rolconnlimit - used.role END
           ) AS room
      FROM pg_roles r,
           (SELECT count(*) FILTER (WHERE backend_type = 'client backend') AS server,
                   count(*) FILTER (WHERE backend_type = 'client backend'
                                      AND usename = current_user) AS role
              FROM pg_stat_activity) used
     WHERE r.rolname = current_user
    """,
)


def db_connection_room(session: Connection) -> int:
    """How many more connections the server would give this session's role now
    (0 or less: a new one is refused, every slot taken)."""
    row = runner.one(session, _CONNECTION_ROOM)
    return int(row["room"]) if row is not None else 0


def ping(session: Connection) -> None:
    """One round trip: the session's connection is open and answers."""
    runner.exec(session, _PING)
