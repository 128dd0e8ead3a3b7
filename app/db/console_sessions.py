"""Repository of signed-out console sessions (`console_sessions_revoked`):
a session id is kept until its cookie would have expired."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text


def console_session_revoke(session: Connection, sid: str, expires_at: datetime) -> None:
    """Record `sid` as signed out (again: no change), and forget sessions
    whose cookies have expired by now."""
    session.execute(
        text(
            "INSERT INTO console_sessions_revoked (sid, expires_at) VALUES (:sid, :exp)"
            " ON CONFLICT (sid) DO NOTHING"
        ),
        {"sid": sid, "exp": expires_at},
    )
    session.execute(text("DELETE FROM console_sessions_revoked WHERE expires_at < now()"))


def console_session_is_revoked(session: Connection, sid: str) -> bool:
    return (
        session.execute(
            text("SELECT 1 FROM console_sessions_revoked WHERE sid = :sid"), {"sid": sid}
        ).scalar_one_or_none()
        is not None
    )
