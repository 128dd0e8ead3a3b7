"""The table of deliveries the SMTP sink refused (`smtp_refusals`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Identity, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models import NOW, TS, Base, one_of


class SmtpRefusal(Base):
    """One delivery attempt the sink refused: when, the envelope recipients it
    knew (none when refused before RCPT TO), the reply's code and text, why,
    and the namespace its sender authenticated for. No content, no
    credentials; kept `SIGNALBOX_RETENTION_HOURS`, like the mail."""

    __tablename__ = "smtp_refusals"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    refused_at: Mapped[datetime] = mapped_column(TS, server_default=NOW)
    recipients: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default="{}")
    code: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(String(200), server_default="")
    auth_namespace: Mapped[str | None] = mapped_column(String(128))
    __table_args__ = (
        *one_of("smtp_refusals", "reason"),
        Index(None, "recipients", postgresql_using="gin"),
        Index(None, "refused_at"),
    )
