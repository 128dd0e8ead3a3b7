"""Tables of the sink's chaos rules and of revoked console sessions (split
from app/db/models.py, which imports them so that `Base.metadata` holds
every table)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, Float, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import Base, one_of

NOW = text("now()")
TS = DateTime(timezone=True)


class ChaosRule(Base):
    """A namespace's rule for the sink: answer `stage` for `recipient` (an
    address or `*@domain`) with `reply`, `times` times or with `probability`,
    until `expires_at`. `applied` is counted by one guarded update, shared by
    every sink process."""

    __tablename__ = "chaos_rules"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(128))
    # The rule's place in its namespace's list: the first that applies answers.
    position: Mapped[int] = mapped_column(Integer)
    recipient: Mapped[str] = mapped_column(String(320))
    stage: Mapped[str] = mapped_column(String(8))
    reply: Mapped[str] = mapped_column(String(512))
    times: Mapped[int | None] = mapped_column(Integer)
    probability: Mapped[float | None] = mapped_column(Float)
    applied: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = mapped_column(TS, server_default=NOW)
    expires_at: Mapped[datetime] = mapped_column(TS)
    __table_args__ = (
        *one_of("chaos_rules", "stage"),
        CheckConstraint("(times IS NULL) <> (probability IS NULL)", name="times_or_probability"),
        Index(None, "namespace", "position"),
        Index(None, "expires_at"),
    )


class ConsoleSessionRevoked(Base):
    """A console session signed out before its cookie expired: every API
    replica refuses the cookie while its row is here (until `expires_at`, when
    the cookie expires by itself and the row may go)."""

    __tablename__ = "console_sessions_revoked"
    sid: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(TS)
