"""Readiness's question to the repository: does PostgreSQL answer?
(`app.observability.health` asks it among its probes.)"""

from __future__ import annotations

from app.db import server as server_db
from app.db.engine import get_engine, transaction
from app.settings import Settings


def database_answers(settings: Settings) -> bool:
    """PostgreSQL answers a query on a pooled connection (pre-pinged)."""
    try:
        with transaction(get_engine(settings)) as session:
            server_db.db_now(session)
        return True
    except Exception:  # any database error means "not ready"
        return False
