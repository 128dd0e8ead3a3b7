"""messages.bare_lf: a line of the message ended in a bare LF

The sink accepts mail whose lines end in a bare LF (what smtplib sends for
bytes) and keeps the bytes as received; the flag says so on the message, in
the signal's view and in the evidence, since real mail servers may refuse it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 14:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "messages",
        sa.Column("bare_lf", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("messages", "bare_lf")
