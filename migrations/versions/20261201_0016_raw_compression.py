"""raw compression: message bytes are stored compressed with lz4 where it is built in

A stored message's raw bytes (`messages.raw`, `sink_messages.raw`) are
TOASTed like any large value: PostgreSQL compresses a value when its row
exceeds about 2 kB and the compressed form is smaller. The method is
PostgreSQL's default (`pglz`) unless the column names one; `lz4` compresses
mail about as well, several times faster. It is chosen here when this server
was built with it (`default_toast_compression` offers it, PostgreSQL 14 and
later), else `pglz` is named. A server older than 14 has no per-column method
and is left as it is. Values already stored keep the method they were
written with: only new rows (and rewritten ones) are stored with lz4.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (("messages", "raw"), ("sink_messages", "raw"))


def upgrade() -> None:
    method = _method()
    if method is None:
        return
    for table, column in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION {method}")


def downgrade() -> None:
    if _method() is None:
        return
    for table, column in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION DEFAULT")


def _method() -> str | None:
    """lz4 when this server has it, else pglz; None before PostgreSQL 14."""
    offered = (
        op.get_bind()
        .execute(
            sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
        )
        .scalar()
    )
    if offered is None:
        return None
    return "lz4" if "lz4" in offered else "pglz"
