"""Readiness's question to the repository: does PostgreSQL answer?
(`app.observability.health` asks it among its probes.)"""

from __future__ import annotations

from app.db import server as server_db
from app.db.engine import get_engine, transaction
from app.settings import Settings


def database_answers(settings: Settings) -> bool:
    """PostgreSQL answers a query on a pooled connection (pre-pinged), and has
    a connection slot left for this process's role: with every slot taken by
    another client, the pool serves what it holds but nothing that needs one
    more (a worker starting, the pool growing, a connection replaced)."""
    try:
        with transaction(get_engine(settings)) as session:
            return server_db.db_connection_room(session) > 0
    except Exception:  # any database error means "not ready"
        return False
