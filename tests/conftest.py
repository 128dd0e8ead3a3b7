"""Test configuration: the real-service fixtures live in tests/stack_fixtures.py."""

import logging
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# celery.contrib.pytest: `celery_app` and `celery_worker` (a worker thread in this
# process) for tests of the task layer (tests/integration/test_tasks.py).
pytest_plugins = ["tests.stack_fixtures", "celery.contrib.pytest"]

# No per-example deadline: on a loaded machine (CI's two cores, shared with
# the stack's processes) one example can stall past Hypothesis' default
# 200 ms, which fails the test as flaky though nothing is wrong. Loaded at
# import, before any test module builds its @settings (which start from the
# profile loaded then), so it applies to the whole run; a test that bounds its
# time says so with its own deadline. clients/python/tests/conftest.py loads
# the same profile for a run of the client's tests alone.
settings.register_profile("signalbox", deadline=None)
settings.load_profile("signalbox")

# Where bytecode is cached when the environment asks Python not to write it
# beside the sources (PYTHONDONTWRITEBYTECODE): gitignored, removed by `make clean`.
PYCACHE = Path(__file__).resolve().parents[1] / ".pytest_cache" / "pycache"


def _cache_bytecode() -> None:
    """Let this process and every process the tests start cache their bytecode.

    The suite starts a few hundred Python processes (stacks' API, sink, worker
    and beat; the CLI); under PYTHONDONTWRITEBYTECODE each one compiled every
    module it imported from source again: 4.5 s of CPU to import the API
    instead of 1.8 s. The cache goes under PYCACHE (PYTHONPYCACHEPREFIX), so
    the source tree stays as clean as the setting meant it to."""
    if not sys.dont_write_bytecode:
        return
    PYCACHE.mkdir(parents=True, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    sys.pycache_prefix = str(PYCACHE)
    sys.dont_write_bytecode = False


_cache_bytecode()


# `make test-fast` leaves out what is marked `servers`: a test that runs
# Signalbox's processes (a stack) or another server (MailDev, Dovecot, Chromium,
# Node, postfix, RabbitMQ, the `up` command), by the fixtures it uses or where
# it lives. What is left runs on the embedded PostgreSQL and Redis alone.
SERVER_FIXTURES = frozenset(
    {"stack_factory", "shared_stack", "tenancy_stack", "strict", "required_stack"}
    | {"maildev", "dovecot", "node_deps"}
)
SERVER_DIRS = frozenset({"acceptance", "browser", "clients", "deploy"})
SERVER_FILES = frozenset({"test_faults.py", "test_pods.py", "test_sink_mta_relay.py"})


# `make test` runs the suite on two pytest-xdist workers. Each has its own
# PostgreSQL, Redis, stacks and block of ports (tests/servers/base.py); what
# the workers share of the checkout is made safe to share where it is used
# (scripts/install-node-deps.sh builds under a lock, and only when its sources
# changed; `npm pack` runs in a copy of the client). No test may rely on
# running alone: xdist_group cannot say so (pytest 9 ignores the node ids
# pytest-xdist 3.8 rewrites for it).


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `servers` every test that needs a server beyond PostgreSQL and Redis."""
    for item in items:
        root = item.config.rootpath
        where = item.path.relative_to(root).parts if item.path.is_relative_to(root) else ()
        if (
            SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or (len(where) > 2 and where[0] == "tests" and where[1] in SERVER_DIRS)
            or item.path.name in SERVER_FILES
        ):
            item.add_marker(pytest.mark.servers)


def pytest_unconfigure(config: object) -> None:
    """Drop root log handlers a test left on a stream that pytest has closed.

    A test that configures this process's logging as a Celery process does
    (the in-process worker's setup_logging hook) leaves a handler on pytest's
    capture stream; libraries that log from atexit (embedded PostgreSQL
    stopping its servers) would then print "Logging error" tracebacks."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        stream = getattr(handler, "stream", None)
        if stream is not None and stream not in (sys.__stderr__, sys.__stdout__):
            root.removeHandler(handler)
