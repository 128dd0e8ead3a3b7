"""Fixtures several integration test files use: real servers, an engine, an ops API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.db.engine import get_engine, make_engine
from tests.integration.helpers import OPS_TOKEN
from tests.integration.looks import Looks
from tests.servers import DovecotServer, MaildevServer, dovecot_server, maildev_server
from tests.servers.webhook_receiver import Receiver, webhook_receiver
from tests.stack import Stack


@pytest.fixture
def maildev(tmp_path: Path) -> Iterator[MaildevServer]:
    """A private MailDev for this test (logs and mail under tmp_path/maildev)."""
    with maildev_server(tmp_path / "maildev") as server:
        yield server


@pytest.fixture
def dovecot(tmp_path: Path) -> Iterator[DovecotServer]:
    """A private Dovecot for this test (config and log under tmp_path/dovecot)."""
    with dovecot_server(tmp_path / "dovecot") as server:
        yield server


@pytest.fixture
def in_process(service_env: dict[str, str]) -> Iterator[None]:
    """Use cases called in this process, on the test's database and Redis."""
    yield
    get_engine().dispose()  # this process's pooled connections, before the database goes


@pytest.fixture
def looks(in_process: None) -> Looks:
    """Signals created and looked at in this process (tests/integration/looks.py)."""
    made = Looks()
    # A breaker is clean once a look has succeeded: the first whole look of
    # the sink (a fresh Redis knows no breaker) records it.
    made.create(quick=False)
    return made


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A small engine on this test's database."""
    eng = make_engine(database_url, pool_size=2)
    yield eng
    eng.dispose()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver that fails its first two requests with 500."""
    with webhook_receiver(failures=2) as state:
        yield state


@pytest.fixture
def ops_stack(stack: Stack, tmp_path: Path) -> Iterator[Stack]:
    """A second API process on the shared stack's database that knows alice's
    ops token (`OPS_TOKEN`)."""
    logs = tmp_path / "ops-logs"
    logs.mkdir()
    ops = Stack(env={**stack.env, "SIGNALBOX_OPS_TOKENS": f"alice:{OPS_TOKEN}"}, logs=logs)
    ops.start_api()
    try:
        yield ops
    finally:
        ops.stop()
