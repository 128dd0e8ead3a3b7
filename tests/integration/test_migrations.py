"""`alembic upgrade head` gives exactly the schema the models describe, and
`signalbox-server db upgrade` applies it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from app.db.migrate import alembic_config, upgrade
from app.db.models import Base
from app.settings import to_sqlalchemy_url
from tests.stack_fixtures import ROOT, PgServer, _libpq

pytestmark = pytest.mark.integration


@pytest.fixture
def empty_database(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_empty_database(f"sbx_empty_{os.getpid()}")
    yield url
    pg_server.drop_database(url)


def test_upgrade_head_matches_the_models(empty_database: str) -> None:
    upgrade(empty_database)
    engine = create_engine(to_sqlalchemy_url(empty_database))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        triggers = conn.exec_driver_sql(
            "SELECT tgname FROM pg_trigger WHERE tgname = 'signals_notify'"
        ).all()
    engine.dispose()
    assert diff == []
    assert triggers == [("signals_notify",)]


def test_db_upgrade_command_migrates_an_empty_database(empty_database: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(SIGNALBOX_DATABASE_URL=empty_database, SIGNALBOX_BROKER_URL="redis://127.0.0.1:1/0")
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "db", "upgrade"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(_libpq(empty_database)) as conn:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    head = ScriptDirectory.from_config(alembic_config(empty_database)).get_current_head()
    assert version == (head,)
