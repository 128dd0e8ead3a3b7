"""SIGNALBOX_API_WORKERS: several uvicorn processes behind one port; each has
its own long-poll notifier, so a long poll wakes whichever process holds it."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_rows, signal_view
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

# The long poll re-reads its signal every 5 s anyway
# (app.api.routes.signals.RECHECK_SECONDS). A poll parked PARK_SECONDS before
# the change would be answered by that re-read no sooner than
# 5 - PARK_SECONDS s after it; a poll answered within MARGIN_SECONDS of the
# commit was woken by its process's notifier.
PARK_SECONDS = 1.0
MARGIN_SECONDS = 3.0


def _api_processes(stack: Stack) -> list[int]:
    pid = stack.procs["api"].pid
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(400)
def test_long_polls_wake_on_every_api_worker_process(stack_factory: Callable[..., Stack]) -> None:
    """With two API processes, long polls parked on either one are answered
    as soon as their signals stop waiting: each process's notifier wakes the
    polls it holds, well before their periodic re-read."""
    stack = stack_factory({"SIGNALBOX_API_WORKERS": "2"})
    stack.spawn("api", ["api"])
    # Each uvicorn worker process imports the whole app: slow on a busy machine.
    wait_until(
        lambda: stack.log_text("api").count("Application startup complete") >= 2,
        240,
        interval=0.5,
        what="both API processes to start",
    )
    assert len(_api_processes(stack)) >= 2
    signals = [create_signal(stack, expires_in_seconds=120) for _ in range(8)]

    def poll(signal_id: str) -> tuple[float, str]:
        view = signal_view(stack, signal_id, wait=30)
        return time.monotonic(), view["status"]

    with ThreadPoolExecutor(max_workers=len(signals)) as pool:
        polls = [pool.submit(poll, s["signal_id"]) for s in signals]
        time.sleep(PARK_SECONDS)  # the polls are parked, spread over both processes
        assert not any(p.done() for p in polls)
        # One statement, one commit: every poll's signal changes at once, and
        # the time to the answers counts from the commit (db_rows returns
        # after it), not from before a connection a loaded machine makes slowly.
        db_rows(
            stack,
            "UPDATE signals SET status = 'expired' WHERE id = ANY(%s)",
            [s["signal_id"] for s in signals],
        )
        changed_at = time.monotonic()
        answers = [p.result(timeout=40) for p in polls]
    assert [status for _, status in answers] == ["expired"] * len(signals)
    assert max(at for at, _ in answers) - changed_at < MARGIN_SECONDS
