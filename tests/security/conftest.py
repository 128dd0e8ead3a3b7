"""A stack for the security tier with tenants that own domains and an operator.

One for the session (API, sink, workers, beat) on its own database; tests
keep apart by fresh run ids and addresses, never by emptying tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.stack import TOKENS, Stack
from tests.stack_fixtures import PgServer, session_stack

OPS_TOKEN = "tok-ops-0123456789"
# Namespace "default" (A) owns team-a.test, "other" (B) owns team-b.test.
DOMAINS = {"team-a.test": "default", "team-b.test": "other"}
TOKEN_A = TOKENS["default"]
TOKEN_B = TOKENS["other"]
# A second sink-typed provider open to namespace A only (`namespaces = [...]`).
A_ONLY_PROVIDER = "corp-inbox"


@pytest.fixture(scope="session")
def tenancy_stack(
    pg_server: PgServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    env = {
        "SIGNALBOX_OPS_TOKENS": f"sre:{OPS_TOKEN}",
        "SIGNALBOX_NAMESPACE_DOMAINS": ",".join(f"{ns}:{d}" for d, ns in DOMAINS.items()),
    }
    data = tmp_path_factory.mktemp("tenancy")
    (data / "providers.toml").write_text(
        f'[providers.{A_ONLY_PROVIDER}]\ntype = "sink"\nnamespaces = ["default"]\n'
    )
    with session_stack(pg_server, redis_url, data, 2, env) as stack:
        yield stack
