"""The first looks the API makes itself (app.usecases.signals.first_look_here):
one look per provider at a time in a process, creates meanwhile ride in one
more round, and a round that cannot be made here sends its task. Real
threads; the look itself is a stand-in (the stack's tests make real ones:
tests/integration/test_first_look.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from app.settings import Settings
from app.usecases import signals
from app.usecases.checks import CheckReport


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    tasks: list[str] = []

    def enqueue(provider: str, signal_id: str, ttl: float) -> bool:
        tasks.append(signal_id)
        return True

    monkeypatch.setattr(signals.dispatch, "enqueue_first_look", enqueue)
    return tasks


def test_creates_during_a_look_ride_in_one_more_round(sent: list[str]) -> None:
    rounds: list[str] = []
    started = threading.Event()
    release = threading.Event()

    def look(signal_id: str) -> object:
        rounds.append(signal_id)
        if len(rounds) == 1:
            started.set()
            release.wait(5)
        return CheckReport()

    first = threading.Thread(
        target=signals.first_look_here, args=(Settings(), look, "sig_a", "sink")
    )
    first.start()
    assert started.wait(5)
    # Five creates while the first round runs: none looks itself.
    for i in range(5):
        signals.first_look_here(Settings(), look, f"sig_{i}", "sink")
    assert rounds == ["sig_a"]
    release.set()
    first.join(5)

    # Exactly one more round took them, made for the newest of them: the
    # signal the first round began with may be gone by then (expired and
    # deleted), and a round made for it would find no provider and take
    # nothing, leaving the five to the sweep's grace.
    assert rounds == ["sig_a", "sig_4"]
    assert sent == []
    # Nothing is under way any more: the next create looks itself at once.
    signals.first_look_here(Settings(), look, "sig_next", "sink")
    assert rounds[-1] == "sig_next"


def test_a_look_that_fails_here_sends_its_task_and_frees_the_provider(sent: list[str]) -> None:
    def failing(signal_id: str) -> Any:
        raise RuntimeError("database gone")

    signals.first_look_here(Settings(), failing, "sig_x", "sink")
    signals.first_look_here(Settings(), failing, "sig_y", "sink")

    assert sent == ["sig_x", "sig_y"]


def test_looks_of_different_providers_do_not_wait_for_each_other(sent: list[str]) -> None:
    release = threading.Event()
    seen: list[str] = []

    def slow(signal_id: str) -> object:
        seen.append(signal_id)
        release.wait(5)
        return CheckReport()

    held = threading.Thread(target=signals.first_look_here, args=(Settings(), slow, "a", "one"))
    held.start()
    deadline = time.monotonic() + 5
    while "a" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    other = threading.Thread(target=signals.first_look_here, args=(Settings(), slow, "b", "two"))
    other.start()
    while "b" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    held.join(5)
    other.join(5)

    assert seen == ["a", "b"]


def test_a_full_batch_is_followed_by_another_round(sent: list[str]) -> None:
    """A round that took a full batch (BATCH_LIMIT signals) left due signals
    behind: the look goes on until a round takes fewer."""
    sizes = iter([signals.BATCH_LIMIT, signals.BATCH_LIMIT, 7])
    rounds: list[int] = []

    class Report:
        def __init__(self, n: int) -> None:
            self.signals = n

    def look(signal_id: str) -> object:
        rounds.append(n := next(sizes))
        return Report(n)

    signals.first_look_here(Settings(), look, "sig_burst", "sink")

    assert rounds == [signals.BATCH_LIMIT, signals.BATCH_LIMIT, 7]
    assert sent == []
