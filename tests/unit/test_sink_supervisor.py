"""When the sink's supervisor restarts a dead sink process and when it gives up
(app/cli/sink_processes.py): a process that exits on its own right after its
start would exit again; one killed by a signal is restarted, however young,
up to a third young death in a row."""

from __future__ import annotations

import signal

import pytest

from app.cli.sink_processes import EARLY_DEATHS, MIN_LIFETIME_SECONDS, gives_up

KILLED = -signal.SIGKILL
YOUNG = MIN_LIFETIME_SECONDS - 0.1
OLD = MIN_LIFETIME_SECONDS


@pytest.mark.parametrize("code", [0, 1, 2])
def test_a_young_process_that_exits_on_its_own_ends_the_supervisor(code: int) -> None:
    assert gives_up(code, YOUNG, early_deaths=0)


def test_a_young_process_killed_by_a_signal_is_restarted_until_the_third_in_a_row() -> None:
    assert EARLY_DEATHS == 3
    assert not gives_up(KILLED, YOUNG, early_deaths=0)
    assert not gives_up(KILLED, 0.0, early_deaths=1)
    assert gives_up(KILLED, YOUNG, early_deaths=2)


@pytest.mark.parametrize("code", [KILLED, -signal.SIGSEGV, 0, 1])
def test_a_process_that_lived_past_its_start_is_always_restarted(code: int) -> None:
    assert not gives_up(code, OLD, early_deaths=EARLY_DEATHS)
