"""console sessions revoked: sign-out ends the session on every replica

A console session is a signed cookie; signing out used to delete the cookie
in the browser only, and a copy of it kept working until it expired. The
session id of a signed-out session is now kept until the cookie's own expiry,
and a cookie whose session id is here is refused.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 11:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "console_sessions_revoked",
        sa.Column("sid", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("console_sessions_revoked")
