"""SIGNALBOX_API_WORKERS: several uvicorn processes behind one port; each has
its own long-poll notifier, so a long poll wakes whichever process holds it."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_rows, signal_view
from tests.stack_fixtures import Stack, wait_until

pytestmark = pytest.mark.integration

# The long poll re-reads the signal every 5 s anyway; a poll answered sooner
# after the change was woken by its process's notifier.
RECHECK_SECONDS = 5.0


def _api_processes(stack: Stack) -> list[int]:
    pid = stack.procs["api"].pid
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(400)
def test_long_polls_wake_on_every_api_worker_process(stack_factory: Callable[..., Stack]) -> None:
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
        time.sleep(1.5)  # the polls are parked, spread over both processes
        assert not any(p.done() for p in polls)
        changed_at = time.monotonic()
        for s in signals:
            db_rows(stack, "UPDATE signals SET status = 'expired' WHERE id = %s", s["signal_id"])
        answers = [p.result(timeout=40) for p in polls]
    assert [status for _, status in answers] == ["expired"] * len(signals)
    assert max(at for at, _ in answers) - changed_at < RECHECK_SECONDS
