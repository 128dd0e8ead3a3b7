"""Tables beside app/db/models.py (kept under its size): the namespaces'
chaos rules, signed-out console sessions, and the SMTP sink's refused
deliveries. Imported by app/db/models, so `Base.metadata` holds them."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    Identity,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.db.model_base import Base, Key, Name, Stamped, one_of


class ChaosRule(Base):
    """A namespace's rule for the sink: answer `stage` for `recipient` (an
    address or `*@domain`) with `reply`, `times` times or with `probability`,
    until `expires_at`. `applied` is counted by one guarded update, shared by
    every sink process."""

    __tablename__ = "chaos_rules"
    id: Mapped[Key]
    namespace: Mapped[Name]
    # The rule's place in its namespace's list: the first that applies answers.
    position: Mapped[int] = mapped_column(Integer)
    recipient: Mapped[str] = mapped_column(String(320))
    stage: Mapped[str] = mapped_column(String(8))
    reply: Mapped[str] = mapped_column(String(512))
    times: Mapped[int | None] = mapped_column(Integer)
    probability: Mapped[float | None] = mapped_column(Float)
    applied: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[Stamped]
    expires_at: Mapped[datetime]
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
    expires_at: Mapped[datetime]


class SmtpRefusal(Base):
    """One delivery attempt the sink refused: when, the envelope recipients it
    knew (none when refused before RCPT TO), the reply's code and text, why,
    and the namespace its sender authenticated for. No content, no
    credentials; kept `SIGNALBOX_RETENTION_HOURS`, like the mail."""

    __tablename__ = "smtp_refusals"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    refused_at: Mapped[Stamped]
    recipients: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default="{}")
    code: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(String(200), server_default="")
    auth_namespace: Mapped[Name | None]
    __table_args__ = (
        *one_of("smtp_refusals", "reason"),
        Index(None, "recipients", postgresql_using="gin"),
        Index(None, "refused_at"),
    )
