"""the cancelled state: a producer ends a signal its test no longer waits for

- the status `cancelled` (final, from `waiting`, `found` or `claimed`; no
  dead letter) and the claim state `cancelled` (an active claim ended by
  its signal's cancellation): the CHECK constraints on `signals.status`
  and `claims.state` are replaced by ones that allow them;
- `signals.cancel_reason` (1–200 characters, e.g. `test_failed`) and
  `signals.cancelled_at`.

The long poll needs nothing new: the trigger of revision 0007 notifies every
change that leaves `waiting`, and a cancelled view is read again by id.

`ENUMERATED` freezes the values of the columns whose CHECK this revision
writes (a test composes every revision's and compares the models').

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = ("waiting", "found", "claimed", "consumed", "expired", "absent", "arrived")
_CLAIM_STATES = ("active", "released", "lapsed", "consumed")

ENUMERATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("signals", "status"): (*_STATUSES, "cancelled"),
    ("claims", "state"): (*_CLAIM_STATES, "cancelled"),
}

# What 0013 (signals) and 0009 (claims) allowed, restored by the downgrade.
_BEFORE: dict[tuple[str, str], tuple[str, ...]] = {
    ("signals", "status"): _STATUSES,
    ("claims", "state"): _CLAIM_STATES,
}


def _check(table: str, column: str, values: Sequence[str]) -> None:
    listed = ", ".join(f"'{value}'" for value in values)
    op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{column}")
    op.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{column}"
        f" CHECK ({column} IN ({listed})) NOT VALID"
    )
    op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT ck_{table}_{column}")


def upgrade() -> None:
    op.add_column("signals", sa.Column("cancel_reason", sa.String(200), nullable=True))
    op.add_column(
        "signals", sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True)
    )
    for (table, column), values in ENUMERATED.items():
        _check(table, column, values)


def downgrade() -> None:
    # The old rules have no cancelled state: such signals and claims end as
    # the nearest thing they knew (expired by deadline, a released claim).
    op.execute("UPDATE claims SET state = 'released' WHERE state = 'cancelled'")
    op.execute(
        "UPDATE signals SET status = 'expired', expiry_reason = 'deadline',"
        " expired_at = cancelled_at WHERE status = 'cancelled'"
    )
    for (table, column), values in _BEFORE.items():
        _check(table, column, values)
    op.drop_column("signals", "cancelled_at")
    op.drop_column("signals", "cancel_reason")
