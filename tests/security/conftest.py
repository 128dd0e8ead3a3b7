"""A stack for the security tier with tenants that own domains and an operator.

One for the session (API, sink, workers, beat) on its own database; tests
keep apart by fresh run ids and addresses, never by emptying tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.stack import TOKENS, Stack, base_env
from tests.stack_fixtures import PgServer, _flush

OPS_TOKEN = "tok-ops-0123456789"
# Namespace "default" (A) owns team-a.test, "other" (B) owns team-b.test.
DOMAINS = {"team-a.test": "default", "team-b.test": "other"}
TOKEN_A = TOKENS["default"]
TOKEN_B = TOKENS["other"]


@pytest.fixture(scope="session")
def tenancy_stack(
    pg_server: PgServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    url = pg_server.create_database()
    data = tmp_path_factory.mktemp("tenancy")
    logs = data / "logs"
    logs.mkdir()
    env = base_env(url, redis_url.rsplit("/", 1)[0] + "/2", data)
    env.update(
        {
            "SIGNALBOX_OPS_TOKENS": f"sre:{OPS_TOKEN}",
            "SIGNALBOX_NAMESPACE_DOMAINS": ",".join(f"{ns}:{d}" for d, ns in DOMAINS.items()),
        }
    )
    _flush(env["SIGNALBOX_BROKER_URL"])
    stack = Stack(env=env, logs=logs).start()
    yield stack
    stack.stop()
    pg_server.drop_database(url)
