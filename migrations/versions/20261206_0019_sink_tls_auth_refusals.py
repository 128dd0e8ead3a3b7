"""issue 46: the sink's AUTH namespace on its mail, and the deliveries it refused

`sink_messages.auth_namespace` and `messages.auth_namespace`: the namespace
whose API token the SMTP sender authenticated with (its mail is that
namespace's alone). `smtp_refusals`: each delivery attempt the sink refused
(when, envelope recipients, reply code and text, why), for dead letters'
recommendations.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 18:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The values of smtp_refusals.reason (app.domain.refusals.RefusalReason), frozen.
REASONS = (
    "recipient_domain",
    "too_many_recipients",
    "message_too_large",
    "line_too_long",
    "chaos",
    "auth_failed",
    "auth_required",
    "starttls_required",
    "tls_on_plain_port",
)
ENUMERATED = {("smtp_refusals", "reason"): REASONS}


def upgrade() -> None:
    op.add_column("sink_messages", sa.Column("auth_namespace", sa.String(length=128)))
    op.add_column("messages", sa.Column("auth_namespace", sa.String(length=128)))
    op.create_table(
        "smtp_refusals",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "refused_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "recipients", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("code", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.String(length=200), server_default="", nullable=False),
        sa.Column("auth_namespace", sa.String(length=128), nullable=True),
        sa.CheckConstraint(
            "reason IN (" + ", ".join(f"'{r}'" for r in REASONS) + ")",
            name=op.f("ck_smtp_refusals_reason"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_smtp_refusals")),
    )
    op.create_index(
        op.f("ix_smtp_refusals_recipients"),
        "smtp_refusals",
        ["recipients"],
        postgresql_using="gin",
    )
    op.create_index(op.f("ix_smtp_refusals_refused_at"), "smtp_refusals", ["refused_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_smtp_refusals_refused_at"), table_name="smtp_refusals")
    op.drop_index(op.f("ix_smtp_refusals_recipients"), table_name="smtp_refusals")
    op.drop_table("smtp_refusals")
    op.drop_column("messages", "auth_namespace")
    op.drop_column("sink_messages", "auth_namespace")
