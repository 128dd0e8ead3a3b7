"""issue 48: the inbox (message ids at store, read flags, search indexes)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
