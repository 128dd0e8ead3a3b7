"""issue 48: the inbox — a `msg_` id for every sink message at store, the
summary and search columns of `messages`, and their indexes

`sink_messages.message_id` is the id a message has from the moment the sink
stores it (existing rows get one here). `messages` gains the columns the
inbox lists and searches by (From, To, Cc, Message-ID, attachment count, the
subject and text as a `tsvector`, the read flag) with the indexes the search
runs on: newest first by (received_at, id), Message-ID, From, and a GIN index
of the words. A trigger notifies `signalbox_message` with each recorded
message's id (the inbox's live events).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sink_messages", sa.Column("message_id", sa.String(40), nullable=True))
    # Existing sink mail gets an id of the same shape (24 hex after `msg_`);
    # mail a look recorded already keeps the id it was recorded with.
    op.execute(
        """
        UPDATE sink_messages sm
           SET message_id = coalesce(
                 (SELECT m.id FROM messages m
                   WHERE m.provider = 'sink' AND m.provider_message_id = CAST(sm.id AS text)),
                 'msg_' || substr(md5(random()::text || sm.id::text || clock_timestamp()::text),
                                  1, 24))
        """
    )
    op.create_unique_constraint(
        "uq_sink_messages_message_id", "sink_messages", ["message_id"]
    )
    op.add_column("messages", sa.Column("from_addr", sa.Text(), nullable=True))
    op.add_column("messages", sa.Column("to_addrs", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("messages", sa.Column("cc_addrs", postgresql.ARRAY(sa.Text()), nullable=True))
    op.add_column("messages", sa.Column("header_message_id", sa.Text(), nullable=True))
    op.add_column(
        "messages", sa.Column("attachments", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column("messages", sa.Column("words", postgresql.TSVECTOR(), nullable=True))
    op.add_column("messages", sa.Column("read_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_messages_received_at_id", "messages", ["received_at", "id"])
    op.create_index("ix_messages_header_message_id", "messages", ["header_message_id"])
    op.create_index("ix_messages_from_addr", "messages", ["from_addr"])
    op.create_index("ix_messages_words", "messages", ["words"], postgresql_using="gin")
    # The inbox's live events: each recorded message's id, whoever recorded
    # it (the sink after its 250, a look at a polled provider). Sent at commit.
    op.execute(
        """
        CREATE FUNCTION messages_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('signalbox_message', NEW.id);
            RETURN NULL;
        END $$;
        CREATE TRIGGER messages_notify AFTER INSERT ON messages
            FOR EACH ROW EXECUTE FUNCTION messages_notify();
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS messages_notify ON messages")
    op.execute("DROP FUNCTION IF EXISTS messages_notify()")
    op.drop_index("ix_messages_words", table_name="messages")
    op.drop_index("ix_messages_from_addr", table_name="messages")
    op.drop_index("ix_messages_header_message_id", table_name="messages")
    op.drop_index("ix_messages_received_at_id", table_name="messages")
    for column in (
        "read_at",
        "words",
        "attachments",
        "header_message_id",
        "cc_addrs",
        "to_addrs",
        "from_addr",
    ):
        op.drop_column("messages", column)
    op.drop_constraint("uq_sink_messages_message_id", "sink_messages", type_="unique")
    op.drop_column("sink_messages", "message_id")
