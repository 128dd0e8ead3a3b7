"""enumerated columns checked: the database refuses a value the code does not know

A CHECK constraint per enumerated column (`ck_<table>_<column>`): a signal's
status, expiry reason, next check's reason and last outcome; a check's reason
and outcome; a near miss's why; a claim's state; a dead letter's reason and
state; a webhook delivery's state. NULL still passes where the column allows
it. The values are frozen here as the code wrote them at this revision
(`app.db.models.ENUMERATED` builds the same lists from `app.domain`; a test
holds the two equal). Each constraint is added NOT VALID, then validated:
the rows already there are checked without blocking writes meanwhile.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHECK_REASONS = ("first", "scheduled", "push", "error_retry", "sweep", "redrive")
_CHECK_OUTCOMES = ("no_match", "matched", "provider_error", "circuit_open")
_EXPIRY_REASONS = ("deadline", "check_budget", "provider_errors", "claims_exhausted")

ENUMERATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("signals", "status"): ("waiting", "found", "claimed", "consumed", "expired"),
    ("signals", "expiry_reason"): _EXPIRY_REASONS,
    ("signals", "next_check_reason"): _CHECK_REASONS,
    ("signals", "last_outcome"): _CHECK_OUTCOMES,
    ("checks", "reason"): _CHECK_REASONS,
    ("checks", "outcome"): _CHECK_OUTCOMES,
    ("near_misses", "why"): (
        "received_before_window",
        "run_marker_mismatch",
        "run_marker_missing",
        "subject_mismatch",
        "body_mismatch",
        "taken_by_other_signal",
    ),
    ("claims", "state"): ("active", "released", "lapsed", "consumed"),
    ("dead_letters", "reason"): _EXPIRY_REASONS,
    ("dead_letters", "state"): ("open", "redriven", "discarded"),
    ("webhook_deliveries", "state"): ("pending", "delivered", "failed"),
}


def upgrade() -> None:
    for (table, column), values in ENUMERATED.items():
        listed = ", ".join(f"'{value}'" for value in values)
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_{column}"
            f" CHECK ({column} IN ({listed})) NOT VALID"
        )
        op.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT ck_{table}_{column}")


def downgrade() -> None:
    for table, column in reversed(ENUMERATED):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT ck_{table}_{column}")
