"""dead letter alerted_at: the dead-letter consumer raises each alert once

The dead letter is published to the `dead_letter` queue, then marked
published (an outbox). When marking fails after the publish (PostgreSQL
restarting between the two), the outbox sweep publishes it again, and the
consumer raised the alert twice: a soak found three such pairs. The consumer
now sets `alerted_at` in the statement that reads the dead letter, and
raises the alert only when it set it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 22:05:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("alerted_at", sa.DateTime(timezone=True)))
    # Dead letters published before this revision were alerted by then, or
    # are on the queue now: their first delivery raises the alert.


def downgrade() -> None:
    op.drop_column("dead_letters", "alerted_at")
