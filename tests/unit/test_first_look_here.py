"""The first looks the API makes itself (`CheckRunner.check` of a
`Why.FIRST_LOOK` request): one look per provider at a time in a runner,
creates meanwhile ride in one more round, and a round that cannot be made
here sends its task. Real threads; the check of a batch is a stand-in (the
stack's tests make real ones: tests/integration/test_first_look.py). Also
the runner's one failure policy for the other in-process checks (the push,
the sweep) and what a task's check sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from app.settings import Settings
from app.usecases.checks import BATCH_LIMIT, CheckReport, CheckRequest, CheckRunner, Why


class Tasks:
    """A task sender that keeps what it was asked to send."""

    def __init__(self) -> None:
        self.first_looks: list[str] = []
        self.checks: list[str] = []
        self.started: list[str] = []

    def check(self, signal_id: str) -> None:
        self.checks.append(signal_id)

    def first_look(self, provider: str, signal_id: str) -> None:
        self.first_looks.append(signal_id)

    def first_look_started(self, signal_id: str) -> None:
        self.started.append(signal_id)


def _unused(name: str) -> Any:
    raise AssertionError("the stand-in asks no provider")


class StandIn(CheckRunner):
    """A runner whose check of one batch is `look`."""

    def __init__(self, look: Callable[[str], CheckReport], tasks: Tasks) -> None:
        super().__init__(Settings(), providers=_unused, breakers=_unused, tasks=tasks)
        self.look = look

    def _batch(self, signal_id: str, **kwargs: Any) -> CheckReport:
        return self.look(signal_id)


@pytest.fixture
def tasks() -> Tasks:
    return Tasks()


def first_look(runner: CheckRunner, signal_id: str, provider: str) -> None:
    runner.check(CheckRequest(signal_id, Why.FIRST_LOOK, provider))


def test_creates_during_a_look_ride_in_one_more_round(tasks: Tasks) -> None:
    rounds: list[str] = []
    started = threading.Event()
    release = threading.Event()

    def look(signal_id: str) -> CheckReport:
        rounds.append(signal_id)
        if len(rounds) == 1:
            started.set()
            release.wait(5)
        return CheckReport()

    runner = StandIn(look, tasks)
    first = threading.Thread(target=first_look, args=(runner, "sig_a", "sink"))
    first.start()
    assert started.wait(5)
    # Five creates while the first round runs: none looks itself.
    for i in range(5):
        first_look(runner, f"sig_{i}", "sink")
    assert rounds == ["sig_a"]
    release.set()
    first.join(5)

    # Exactly one more round took them, made for the newest of them: the
    # signal the first round began with may be gone by then (expired and
    # deleted), and a round made for it would find no provider and take
    # nothing, leaving the five to the sweep's grace.
    assert rounds == ["sig_a", "sig_4"]
    assert tasks.first_looks == []
    # Nothing is under way any more: the next create looks itself at once.
    first_look(runner, "sig_next", "sink")
    assert rounds[-1] == "sig_next"


def test_a_look_that_fails_here_sends_its_task_and_frees_the_provider(tasks: Tasks) -> None:
    def failing(signal_id: str) -> CheckReport:
        raise RuntimeError("database gone")

    runner = StandIn(failing, tasks)
    first_look(runner, "sig_x", "sink")
    first_look(runner, "sig_y", "sink")

    assert tasks.first_looks == ["sig_x", "sig_y"]


def test_looks_of_different_providers_do_not_wait_for_each_other(tasks: Tasks) -> None:
    release = threading.Event()
    seen: list[str] = []

    def slow(signal_id: str) -> CheckReport:
        seen.append(signal_id)
        release.wait(5)
        return CheckReport()

    runner = StandIn(slow, tasks)
    held = threading.Thread(target=first_look, args=(runner, "a", "one"))
    held.start()
    deadline = time.monotonic() + 5
    while "a" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    other = threading.Thread(target=first_look, args=(runner, "b", "two"))
    other.start()
    while "b" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    held.join(5)
    other.join(5)

    assert seen == ["a", "b"]


def test_a_full_batch_is_followed_by_another_round(tasks: Tasks) -> None:
    """A round that took a full batch (BATCH_LIMIT signals) left due signals
    behind: the look goes on until a round takes fewer."""
    sizes = iter([BATCH_LIMIT, BATCH_LIMIT, 7])
    rounds: list[int] = []

    def look(signal_id: str) -> CheckReport:
        rounds.append(n := next(sizes))
        return CheckReport(signals=n)

    first_look(StandIn(look, tasks), "sig_burst", "sink")

    assert rounds == [BATCH_LIMIT, BATCH_LIMIT, 7]
    assert tasks.first_looks == []


@pytest.mark.parametrize("why", [Why.PUSH, Why.SWEEP])
def test_a_push_or_sweep_check_that_fails_here_sends_its_check_task(tasks: Tasks, why: Why) -> None:
    def failing(signal_id: str) -> CheckReport:
        raise RuntimeError("database gone")

    assert StandIn(failing, tasks).check(CheckRequest("sig_p", why, "sink")) is None
    assert tasks.checks == ["sig_p"]
    assert tasks.first_looks == []


def test_signals_pushed_during_a_check_here_are_checked_again_then_left_to_a_task(
    tasks: Tasks,
) -> None:
    """Each round's pushed signals are checked again in this process, up to
    three rounds in all; what the last round leaves pushed gets a task."""
    looked: list[str] = []

    def look(signal_id: str) -> CheckReport:
        looked.append(signal_id)
        return CheckReport(signals=1, pushed=[signal_id + "'"])

    report = StandIn(look, tasks).check(CheckRequest("s", Why.PUSH, "sink"))

    assert report is not None
    assert looked == ["s", "s'", "s''"]
    assert tasks.checks == ["s'''"]


def test_a_tasks_check_hands_the_ticket_back_and_sends_what_it_left(tasks: Tasks) -> None:
    def look(signal_id: str) -> CheckReport:
        return CheckReport(signals=BATCH_LIMIT, pushed=["sig_pushed"])

    report = StandIn(look, tasks).check(CheckRequest("sig_t", Why.TASK))

    assert report is not None and report.signals == BATCH_LIMIT
    assert tasks.started == ["sig_t"]
    # The pushed signal's own check, then the full batch's next task.
    assert tasks.checks == ["sig_pushed", "sig_t"]


def test_a_tasks_check_raises_what_it_raised(tasks: Tasks) -> None:
    def failing(signal_id: str) -> CheckReport:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError):
        StandIn(failing, tasks).check(CheckRequest("sig_t", Why.TASK))
    assert tasks.checks == []
