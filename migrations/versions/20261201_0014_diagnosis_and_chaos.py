"""diagnosis and chaos: near misses with every failed rule, typos, sink chaos rules

A near miss keeps the other rules it failed (`also`, in the order of its
`why`) and, for a `recipient_typo`, the address the message went to
(`address`); the `why` CHECK lists the new order and `recipient_typo`.
`chaos_rules` holds each namespace's rules for the SMTP sink.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The enumerated columns this revision changes or adds, as the code writes
# them here (tests/unit/test_enumerated_columns.py applies them over 0009's).
ENUMERATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("near_misses", "why"): (
        "run_marker_mismatch",
        "run_marker_missing",
        "received_before_window",
        "subject_mismatch",
        "body_mismatch",
        "taken_by_other_signal",
        "recipient_typo",
    ),
    ("chaos_rules", "stage"): ("rcpt", "data"),
}
_OLD_WHY = (
    "received_before_window",
    "run_marker_mismatch",
    "run_marker_missing",
    "subject_mismatch",
    "body_mismatch",
    "taken_by_other_signal",
)


def _listed(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def upgrade() -> None:
    op.add_column(
        "near_misses",
        sa.Column("also", ARRAY(sa.Text()), server_default="{}", nullable=False),
    )
    op.add_column("near_misses", sa.Column("address", sa.String(320), nullable=True))
    op.execute("ALTER TABLE near_misses DROP CONSTRAINT ck_near_misses_why")
    op.execute(
        "ALTER TABLE near_misses ADD CONSTRAINT ck_near_misses_why"
        f" CHECK (why IN ({_listed(ENUMERATED[('near_misses', 'why')])}))"
    )
    op.create_table(
        "chaos_rules",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("recipient", sa.String(320), nullable=False),
        sa.Column("stage", sa.String(8), nullable=False),
        sa.Column("reply", sa.String(512), nullable=False),
        sa.Column("times", sa.Integer(), nullable=True),
        sa.Column("probability", sa.Float(), nullable=True),
        sa.Column("applied", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            f"stage IN ({_listed(ENUMERATED[('chaos_rules', 'stage')])})",
            name=op.f("ck_chaos_rules_stage"),
        ),
        sa.CheckConstraint(
            "(times IS NULL) <> (probability IS NULL)",
            name=op.f("ck_chaos_rules_times_or_probability"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chaos_rules")),
    )
    op.create_index("ix_chaos_rules_namespace_position", "chaos_rules", ["namespace", "position"])
    op.create_index("ix_chaos_rules_expires_at", "chaos_rules", ["expires_at"])


def downgrade() -> None:
    op.drop_table("chaos_rules")
    op.execute("DELETE FROM near_misses WHERE why = 'recipient_typo'")
    op.execute("ALTER TABLE near_misses DROP CONSTRAINT ck_near_misses_why")
    op.execute(
        "ALTER TABLE near_misses ADD CONSTRAINT ck_near_misses_why"
        f" CHECK (why IN ({_listed(_OLD_WHY)}))"
    )
    op.drop_column("near_misses", "address")
    op.drop_column("near_misses", "also")
