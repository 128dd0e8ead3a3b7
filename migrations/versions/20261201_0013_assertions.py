"""assertions: what a signal expects, the claim's owner, duplicate messages

- `signals.expect` (`first`, `exactly_one`, `none`; default `first`, as
  every signal before) and `signals.settle_seconds` (`exactly_one` only);
- the statuses `absent` and `arrived` (`expect: none`, both final) and the
  expiry reason `duplicate_messages` (`expect: exactly_one`): the CHECK
  constraints of migration 0009 on `signals.status`, `signals.expiry_reason`
  and `dead_letters.reason` are replaced by ones that allow them, and
  `signals.expect` gets its own;
- an `arrived` signal shows its message without taking it: the unique
  (namespace, message_id) constraint becomes a unique index of the signals
  that are not `arrived`;
- `claims.owner` and `receipts.owner`: who holds (held) the claim;
- `dead_letters.duplicates`: both messages of a `duplicate_messages` dead
  letter and how far apart they came.

`ENUMERATED` freezes the values of the columns whose CHECK this revision
writes (a test composes 0009's with this one's and compares the models').

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-01 14:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EXPIRY_REASONS = (
    "deadline",
    "check_budget",
    "provider_errors",
    "claims_exhausted",
    "duplicate_messages",
)

ENUMERATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("signals", "status"): (
        "waiting",
        "found",
        "claimed",
        "consumed",
        "expired",
        "absent",
        "arrived",
    ),
    ("signals", "expiry_reason"): _EXPIRY_REASONS,
    ("signals", "expect"): ("first", "exactly_one", "none"),
    ("dead_letters", "reason"): _EXPIRY_REASONS,
}

# What 0009 allowed, restored by the downgrade.
_BEFORE: dict[tuple[str, str], tuple[str, ...]] = {
    ("signals", "status"): ("waiting", "found", "claimed", "consumed", "expired"),
    ("signals", "expiry_reason"): _EXPIRY_REASONS[:4],
    ("dead_letters", "reason"): _EXPIRY_REASONS[:4],
}


def _check(table: str, column: str, values: Sequence[str]) -> None:
    listed = ", ".join(f"'{value}'" for value in values)
    op.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{column}"
        f" CHECK ({column} IN ({listed})) NOT VALID"
    )
    op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT ck_{table}_{column}")


def upgrade() -> None:
    op.add_column(
        "signals",
        sa.Column("expect", sa.String(16), server_default="first", nullable=False),
    )
    op.add_column("signals", sa.Column("settle_seconds", sa.SmallInteger(), nullable=True))
    op.add_column("claims", sa.Column("owner", sa.String(200), nullable=True))
    op.add_column("receipts", sa.Column("owner", sa.String(200), nullable=True))
    op.add_column(
        "dead_letters",
        sa.Column("duplicates", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    for (table, column), values in ENUMERATED.items():
        if (table, column) in _BEFORE:
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{column}")
        _check(table, column, values)
    op.drop_constraint("uq_signals_namespace_message_id", "signals", type_="unique")
    op.create_index(
        "uq_signals_namespace_message_id",
        "signals",
        ["namespace", "message_id"],
        unique=True,
        postgresql_where=sa.text("status <> 'arrived'"),
    )


def downgrade() -> None:
    # Signals of the new kinds cannot be kept under the old rules.
    op.execute("DELETE FROM signals WHERE status IN ('absent', 'arrived')")
    op.execute(
        "UPDATE signals SET expiry_reason = 'deadline' WHERE expiry_reason = 'duplicate_messages'"
    )
    op.execute("UPDATE dead_letters SET reason = 'deadline' WHERE reason = 'duplicate_messages'")
    op.drop_index("uq_signals_namespace_message_id", table_name="signals")
    op.create_unique_constraint(
        "uq_signals_namespace_message_id", "signals", ["namespace", "message_id"]
    )
    for table, column in reversed(ENUMERATED):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{column}")
        if (table, column) in _BEFORE:
            _check(table, column, _BEFORE[(table, column)])
    op.drop_column("dead_letters", "duplicates")
    op.drop_column("receipts", "owner")
    op.drop_column("claims", "owner")
    op.drop_column("signals", "settle_seconds")
    op.drop_column("signals", "expect")
