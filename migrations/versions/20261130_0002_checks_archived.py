"""signals.checks_archived: check counts by outcome folded in by retention

Retention deletes the check rows of finished signals after
SIGNALBOX_RETENTION_HOURS; their counts move here so a run's evidence keeps
its check counts for the evidence horizon.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 01:05:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "signals",
        sa.Column(
            "checks_archived",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default="{}",
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("signals", "checks_archived")
