"""Readiness's question to the repository: does PostgreSQL answer?
(`app.observability.health` asks it among its probes.)"""

from __future__ import annotations

from app.db import server as server_db
from app.db.engine import get_engine, opens_new_connection, transaction
from app.settings import Settings


def database_answers(settings: Settings) -> bool:
    """PostgreSQL answers a query on a pooled connection (pre-pinged), and still
    gives this process a new connection: with every slot taken by another
    client, the pool serves what it holds but nothing that needs one more."""
    engine = get_engine(settings)
    try:
        with transaction(engine) as session:
            server_db.db_now(session)
    except Exception:  # any database error means "not ready"
        return False
    return opens_new_connection(engine)
