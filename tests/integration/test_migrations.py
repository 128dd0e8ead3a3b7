"""`alembic upgrade head` gives exactly the schema the models describe."""

from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from app.db.migrate import upgrade
from app.db.models import Base
from app.settings import to_sqlalchemy_url
from tests.stack_fixtures import PgServer, conninfo_to_url

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
