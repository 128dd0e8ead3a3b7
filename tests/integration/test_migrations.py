"""`alembic upgrade head` gives exactly the schema the models describe."""

from __future__ import annotations

import os

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from app.db.migrate import upgrade
from app.db.models import Base
from app.settings import to_sqlalchemy_url
from tests.stack_fixtures import PgServer, _libpq, conninfo_to_url

pytestmark = pytest.mark.integration


def test_upgrade_head_matches_the_models(pg_server: PgServer) -> None:
    name = "sbx_migration_check"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(pg_server.admin_url)
    info["dbname"] = name
    url = conninfo_to_url(psycopg.conninfo.make_conninfo(**info))
    try:
        upgrade(url)
        engine = create_engine(to_sqlalchemy_url(url))
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            triggers = conn.exec_driver_sql(
                "SELECT tgname FROM pg_trigger WHERE tgname = 'signals_notify'"
            ).all()
        engine.dispose()
        assert diff == []
        assert triggers == [("signals_notify",)]
    finally:
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_db_upgrade_command_migrates_an_empty_database(pg_server: PgServer) -> None:
    import subprocess
    import sys

    from tests.stack_fixtures import ROOT

    name = "sbx_cli_upgrade"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(pg_server.admin_url)
    info["dbname"] = name
    url = conninfo_to_url(psycopg.conninfo.make_conninfo(**info))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
        env.update(SIGNALBOX_DATABASE_URL=url, SIGNALBOX_BROKER_URL="redis://127.0.0.1:1/0")
        done = subprocess.run(
            [sys.executable, "-m", "app.cli", "db", "upgrade"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        with psycopg.connect(_libpq(url)) as conn:
            version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        from alembic.script import ScriptDirectory

        from app.db.migrate import alembic_config

        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        assert version == (head,)
    finally:
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
