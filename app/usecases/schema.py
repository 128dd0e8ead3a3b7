"""The database's schema brought to a revision: what `signalbox-server db
upgrade` and `up` ask for before anything else runs."""

from __future__ import annotations

from app.db import migrate


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply the migrations up to `revision` (Alembic's `head` by default)."""
    migrate.upgrade(database_url, revision)
