"""address holds: isolation without configuration

An address nobody owns is held by the first namespace that watches it; each
hold is an episode (address, namespace, held_from, released_at), the open one
(released_at NULL) unique per address. A message records the recipients it
belongs by (`delivered_to`: the envelope's where the provider knows it, else
To and Cc), so who may see it is decided by who owned or held those when it
was received. Signals get an index on (recipient, namespace): a hold's lapse
is judged from its namespace's signals on the address.

Existing signals: each address gets one open hold, for the namespace of its
latest signal, from that namespace's first signal on it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "address_holds",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("address", sa.String(320), nullable=False),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("held_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_address_holds")),
    )
    op.create_index(
        op.f("ix_address_holds_address_held_from"), "address_holds", ["address", "held_from"]
    )
    op.create_index(
        "ix_address_holds_open",
        "address_holds",
        ["address"],
        unique=True,
        postgresql_where=sa.text("released_at IS NULL"),
    )
    op.add_column("messages", sa.Column("delivered_to", postgresql.ARRAY(sa.Text()), nullable=True))
    op.create_index(
        op.f("ix_signals_recipient_namespace"), "signals", ["recipient", "namespace"]
    )
    op.execute(
        """
        INSERT INTO address_holds (address, namespace, held_from)
        SELECT DISTINCT ON (lower(s.recipient)) lower(s.recipient), s.namespace,
               (SELECT min(f.created_at) FROM signals f
                 WHERE f.recipient = s.recipient AND f.namespace = s.namespace)
          FROM signals s
         WHERE NOT EXISTS (SELECT 1 FROM mailboxes b WHERE b.address = lower(s.recipient))
         ORDER BY lower(s.recipient), s.created_at DESC
        """
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_signals_recipient_namespace"), table_name="signals")
    op.drop_column("messages", "delivered_to")
    op.drop_index("ix_address_holds_open", table_name="address_holds")
    op.drop_index(op.f("ix_address_holds_address_held_from"), table_name="address_holds")
    op.drop_table("address_holds")
