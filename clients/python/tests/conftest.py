"""Fixtures for the client's tests.

``live_stack`` (the running API, SMTP sink, worker and beat) comes from the
server's test tree, ``tests/stack_fixtures.py`` at the repository root. Until
that module exists, a stand-in fixture skips the acceptance tests that need it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import signalbox
from hypothesis import settings
from signalbox_fakes import DEAD_LETTER, FakeApi, FakeClock, ScriptedLongPoll, reply, signal_view

REPO_ROOT = Path(__file__).resolve().parents[3]
# This tree has no __init__.py (it would shadow the root `tests` package), so the
# repository root is not on sys.path by itself; it is needed to import tests.stack_fixtures.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

_HAVE_STACK = importlib.util.find_spec("tests.stack_fixtures") is not None

pytest_plugins = ["pytester", *(["tests.stack_fixtures"] if _HAVE_STACK else [])]

# No per-example deadline, as in the server's tests/conftest.py (which a run
# of this tree alone does not load): a loaded machine can stall one example
# past Hypothesis' default 200 ms, failing the test as flaky though nothing
# is wrong. Loaded at import, before the test modules build their @settings.
settings.register_profile("signalbox", deadline=None)
settings.load_profile("signalbox")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fake ``time.monotonic`` for the client's waits, starting at 1000."""
    fake = FakeClock()
    monkeypatch.setattr(signalbox._core.time, "monotonic", fake)
    return fake


@pytest.fixture
def expiring_api(clock: FakeClock) -> FakeApi:
    """An API whose new signal ``sig_1`` waits 3 minutes of ``clock``'s time, then
    expires with ``DEAD_LETTER``: the README's first-hour case, past the old 120 s
    client default."""
    expired = signal_view("expired", dead_letter=DEAD_LETTER)
    return (
        FakeApi()
        .on("POST", "/v1/signals", reply(201, signal_view()))
        .on("GET", "/v1/signals/sig_1", ScriptedLongPoll(clock, 180, expired))
    )


if not _HAVE_STACK:

    @pytest.fixture(scope="session")
    def live_stack() -> None:
        pytest.skip("live stack not available yet: tests/stack_fixtures.py is missing")
