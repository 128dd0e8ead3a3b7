"""Repository of signed-out console sessions (`console_sessions_revoked`):
a session id is kept until its cookie would have expired."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection

from app.db import runner
from app.db.runner import Statement

_REVOKE: Statement = Statement(
    "console_session_revoke",
    "INSERT INTO console_sessions_revoked (sid, expires_at) VALUES (:sid, :exp)"
    " ON CONFLICT (sid) DO NOTHING",
)
_FORGET_EXPIRED: Statement = Statement(
    "console_session_forget_expired",
    "DELETE FROM console_sessions_revoked WHERE expires_at < now()",
)
_IS_REVOKED: Statement = Statement(
    "console_session_is_revoked", "SELECT 1 FROM console_sessions_revoked WHERE sid = :sid"
)


def console_session_revoke(session: Connection, sid: str, expires_at: datetime) -> None:
    """Record `sid` as signed out (again: no change), and forget sessions
    whose cookies have expired by now."""
    runner.exec(session, _REVOKE, {"sid": sid, "exp": expires_at})
    runner.exec(session, _FORGET_EXPIRED)


def console_session_is_revoked(session: Connection, sid: str) -> bool:
    return runner.one(session, _IS_REVOKED, {"sid": sid}) is not None
