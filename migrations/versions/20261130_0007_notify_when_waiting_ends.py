"""notify when waiting ends: wake long polls only when a signal stops waiting

A long poll waits only while its signal is `waiting` (result `waiting` or
`provider_error`); on any other status it answers at once. So the only
change that can end a wait is a signal leaving `waiting` (found or
expired). Until now every status change notified: a claim, a consume, a
release and a redrive each woke every API process's listener, and each
notifying commit takes PostgreSQL's notification-queue lock. The trigger
now fires only for that change, and decides it in its WHEN clause, so any
other update of a signal queues no trigger event at all.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 21:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NOTIFY = """
CREATE OR REPLACE FUNCTION signalbox_notify_signal() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('signalbox_signal', NEW.id);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""

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


def upgrade() -> None:
    op.execute(NOTIFY)
    op.execute("DROP TRIGGER signals_notify ON signals")
    op.execute(
        "CREATE TRIGGER signals_notify AFTER UPDATE OF status ON signals FOR EACH ROW"
        " WHEN (OLD.status = 'waiting' AND NEW.status <> 'waiting')"
        " EXECUTE FUNCTION signalbox_notify_signal()"
    )


def downgrade() -> None:
    op.execute(NOTIFY_ON_STATUS)
    op.execute("DROP TRIGGER signals_notify ON signals")
    op.execute(
        "CREATE TRIGGER signals_notify AFTER UPDATE ON signals FOR EACH ROW"
        " EXECUTE FUNCTION signalbox_notify_signal()"
    )
