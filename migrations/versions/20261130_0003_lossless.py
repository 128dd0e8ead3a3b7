"""Nothing lost, per-namespace matching: final looks, counted checks, late mail

- signals.last_look_at: when the latest check's look at the provider began;
  a signal expires on its deadline only after a look at or after it.
- signals: a message is the message of at most one signal per namespace
  (unique (namespace, message_id) instead of unique (message_id)), so one
  namespace's signal never takes a shared message from another's.
- checks.counted: whether the check spent one of max_checks (only checks the
  schedule asked for do), so counts reconcile with the rows.
- dead_letters.late_message: matching mail that arrived after the deadline;
  dead_letters.publish_attempt_at: a lease on publishing, so two sweeps
  never publish one dead letter twice.
- the long-poll trigger notifies only when a signal's status changes (the
  only change that ends a long poll), not on every check.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 05:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


NOTIFY_ON_STATUS = """
CREATE OR REPLACE FUNCTION signalbox_notify_signal() RETURNS trigger AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        PERFORM pg_notify('signalbox_signal', NEW.id);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""

NOTIFY_ON_ANY_CHECK = """
CREATE OR REPLACE FUNCTION signalbox_notify_signal() RETURNS trigger AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       OR NEW.last_outcome IS DISTINCT FROM OLD.last_outcome
       OR NEW.checks_count IS DISTINCT FROM OLD.checks_count THEN
        PERFORM pg_notify('signalbox_signal', NEW.id);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    op.execute(NOTIFY_ON_STATUS)
    op.add_column("signals", sa.Column("last_look_at", sa.DateTime(timezone=True)))
    op.drop_constraint("uq_signals_message_id", "signals", type_="unique")
    op.create_unique_constraint(
        op.f("uq_signals_namespace_message_id"), "signals", ["namespace", "message_id"]
    )
    op.create_index(op.f("ix_signals_message_id"), "signals", ["message_id"])
    op.add_column(
        "checks", sa.Column("counted", sa.Boolean(), server_default="false", nullable=False)
    )
    op.add_column(
        "dead_letters",
        sa.Column("late_message", postgresql.JSONB(astext_type=sa.Text())),
    )
    op.add_column("dead_letters", sa.Column("publish_attempt_at", sa.DateTime(timezone=True)))
    # The per-namespace quota counts waiting signals up to the limit.
    op.create_index(
        "ix_signals_waiting_namespace",
        "signals",
        ["namespace"],
        postgresql_where=sa.text("status = 'waiting'"),
    )
    op.create_index(
        "ix_dead_letters_late_watch",
        "dead_letters",
        ["provider", "created_at"],
        postgresql_where=sa.text("state = 'open' AND late_message IS NULL"),
    )


def downgrade() -> None:
    op.execute(NOTIFY_ON_ANY_CHECK)
    op.drop_index("ix_dead_letters_late_watch", table_name="dead_letters")
    op.drop_index("ix_signals_waiting_namespace", table_name="signals")
    op.drop_column("dead_letters", "publish_attempt_at")
    op.drop_column("dead_letters", "late_message")
    op.drop_column("checks", "counted")
    op.drop_index(op.f("ix_signals_message_id"), table_name="signals")
    op.drop_constraint(op.f("uq_signals_namespace_message_id"), "signals", type_="unique")
    op.create_unique_constraint("uq_signals_message_id", "signals", ["message_id"])
    op.drop_column("signals", "last_look_at")
