"""Test configuration: the real-service fixtures live in tests/stack_fixtures.py."""

import logging
import sys

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
