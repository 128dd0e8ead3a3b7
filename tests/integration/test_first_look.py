"""First-look tickets: a check takes every due signal of its provider, so a
burst of creates sends one first-look task per provider on its way, not one
per create, and no signal is left without its first look (real Redis, real
worker processes, real concurrent creates)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.integration.helpers import db_scalar
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def _create_many(stack: Stack, count: int, clients: int) -> list[str]:
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    def create(i: int) -> str:
        with stack.client() as api:
            response = api.post(
                "/v1/signals",
                json={
                    "run_id": run_id,
                    "test_case": f"case-{i}",
                    "recipient": f"burst-{uuid.uuid4().hex[:8]}@example.test",
                    "expires_in_seconds": 300,
                },
            )
        assert response.status_code == 201, response.text
        return str(response.json()["signal_id"])

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(create, range(count)))


def _first_looks(stack: Stack, ids: list[str]) -> int:
    return int(
        db_scalar(
            stack,
            "SELECT count(DISTINCT signal_id) FROM checks"
            " WHERE signal_id = ANY(%s) AND reason = 'first'",
            ids,
        )
    )


def test_a_burst_of_creates_sends_one_task_that_looks_at_every_signal(
    stack_factory: Callable[..., Stack],
) -> None:
    """250 creates while no worker runs leave one task in the queue (250
    without tickets). Started, the worker's one check takes a batch of 200
    and sends one more for the rest: every signal gets its first look, with
    no sweep running to re-send anything."""
    # A ticket lapses after SIGNALBOX_REQUEUE_AFTER_SECONDS (20 s), as its task
    # may be lost: on a loaded machine 250 creates can take longer, and the
    # next create then rightly sends a second task. Nothing here re-sends.
    stack = stack_factory({"SIGNALBOX_REQUEUE_AFTER_SECONDS": "600"})
    stack.start(worker=False, beat=False)
    ids = _create_many(stack, 250, clients=8)
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    assert broker.llen("signals") == 1

    stack.start_worker()

    wait_until(lambda: _first_looks(stack, ids) == 250, 60, what="every first look")


def test_concurrent_creates_each_get_their_first_look_without_the_sweep(
    stack_factory: Callable[..., Stack],
) -> None:
    """16 clients create while the worker runs: a create refused the ticket
    asks for it after its commit, so the holder's check (which hands the
    ticket back before it takes its batch) sees it. Without beat nothing is
    re-sent: a signal left out would never get its first look."""
    stack = stack_factory()
    stack.start(beat=False)
    ids = _create_many(stack, 240, clients=16)

    wait_until(lambda: _first_looks(stack, ids) == 240, 60, what="every first look")
    tasks = [
        line
        for line in stack.log_text("worker").splitlines()
        if "Task signalbox.check[" in line and "] received" in line
    ]
    assert 0 < len(tasks) < 240, len(tasks)
