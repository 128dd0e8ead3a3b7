"""notify with the view: a long poll woken by a found signal answers without reading it again

When a signal stops waiting, the trigger of revision 0007 notifies its id,
and every long poll on it read the signal again (a statement, a connection
and a thread hop in the API for each wake-up). The notification now carries,
after the id and one space, what the view of a signal that is `found`,
`arrived` or `absent` is made of: the row as the statement that ended the
wait left it, and its message's summary (`view_message_*`, as
`signal_view_get` reads them). Those views need nothing else; an `expired`
signal's view shows its dead letter, which is written after the expiry, so
it is still notified by id alone and read again. A payload that would not
fit PostgreSQL's limit on notifications (a large `metadata`) is sent by id
alone too: a notification that was too long would fail the transaction that
found the message.

Every change that ends a wait is made by one statement, so the row of the
notification is the row as committed.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 04:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# PostgreSQL refuses a payload of 8,000 bytes or more; the id and a space come first.
NOTIFY_WITH_VIEW = """
CREATE OR REPLACE FUNCTION signalbox_notify_signal() RETURNS trigger AS $$
DECLARE
    payload text;
BEGIN
    IF NEW.status IN ('found', 'arrived', 'absent') THEN
        SELECT NEW.id || ' ' || json_build_object(
                   'row', row_to_json(NEW),
                   'view_message_id', m.id,
                   'view_message_received_at', m.received_at,
                   'view_message_subject', m.subject,
                   'view_message_run_marker', m.run_marker,
                   'view_message_bare_lf', m.bare_lf)::text
          INTO payload
          FROM (SELECT 1) AS one LEFT JOIN messages m ON m.id = NEW.message_id;
    END IF;
    IF payload IS NULL OR octet_length(payload) >= 7900 THEN
        payload := NEW.id;
    END IF;
    PERFORM pg_notify('signalbox_signal', payload);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""

# Revision 0007's function: the id alone.
NOTIFY_ID = """
CREATE OR REPLACE FUNCTION signalbox_notify_signal() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('signalbox_signal', NEW.id);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql
"""


def upgrade() -> None:
    op.execute(NOTIFY_WITH_VIEW)


def downgrade() -> None:
    op.execute(NOTIFY_ID)
