"""dead letters unalerted: the outbox sends again a dead letter published but never alerted

A dead letter is published to the `dead_letter` queue and marked published;
its consumer raises the alert and sets `alerted_at`. A soak found one alert
missing at the end of its run: the consumer held the task's retry (PostgreSQL
restarting) when a broker loss killed it, and Redis gives an unacknowledged
message back only after its visibility timeout (an hour). The sweep now sends
again, at most every few minutes, a dead letter published that long ago and
still not alerted (the consumer alerts once, however often it is delivered).
This partial index keeps that look cheap however many dead letters are kept.

Dead letters published more than an hour before this revision are marked
alerted: they were alerted by then (before revision 0008 nothing recorded
it), or their message has come back from Redis since. Sending them again
would raise their alerts a second time.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 12:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHERE = "alerted_at IS NULL AND published_at IS NOT NULL"


def upgrade() -> None:
    op.execute(
        "UPDATE dead_letters SET alerted_at = published_at"
        " WHERE alerted_at IS NULL AND published_at < now() - interval '1 hour'"
    )
    op.create_index(
        "ix_dead_letters_unalerted",
        "dead_letters",
        ["published_at"],
        unique=False,
        postgresql_where=sa.text(WHERE),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_dead_letters_unalerted", table_name="dead_letters", postgresql_where=sa.text(WHERE)
    )
