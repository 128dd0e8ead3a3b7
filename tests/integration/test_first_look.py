"""First looks. A sink signal's first look is made by the API that created
it, after its answer: no task, no worker. A polled provider's first look is a
task, and a check takes every due signal of its provider, so a burst of
creates sends one first-look task per provider on its way (a ticket in
Redis), not one per create, and no signal is left without its first look
(real Redis, real worker processes, real MailDev, real concurrent creates)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import redis

from tests.integration.helpers import db_scalar, insert_sink_message, mail, wait_result
from tests.servers import MaildevServer
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def _create_many(stack: Stack, count: int, clients: int, provider: str = "sink") -> list[str]:
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
                    "provider": provider,
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


def _with_maildev(stack: Stack, maildev: MaildevServer) -> None:
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.md]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )


def test_sink_first_looks_are_made_by_the_api_with_no_worker_and_no_task(
    stack_factory: Callable[..., Stack],
) -> None:
    """120 concurrent creates of sink signals while no worker and no beat
    run: every one gets its first look (one check row, reason `first`,
    counted), no task is sent, and a signal whose mail was there before it
    is found by that look alone."""
    stack = stack_factory()
    stack.start(worker=False, beat=False)
    ids = _create_many(stack, 120, clients=8)
    early = f"early-{uuid.uuid4().hex[:8]}@example.test"
    insert_sink_message(stack, early, mail(early))
    with stack.client() as api:
        response = api.post(
            "/v1/signals",
            json={
                "run_id": "run-early",
                "test_case": "early",
                "recipient": early,
                "received_after": (datetime.now(UTC) - timedelta(minutes=1)).isoformat(),
                "expires_in_seconds": 300,
            },
        )
    assert response.status_code == 201, response.text
    found = wait_result(stack, response.json()["signal_id"], wait=20)

    wait_until(lambda: _first_looks(stack, ids) == 120, 60, what="every first look")
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    assert broker.llen("signals") == 0
    assert found["status"] == "found", found
    assert found["checks"] == 1
    counted = db_scalar(
        stack,
        "SELECT count(*) FROM checks WHERE signal_id = ANY(%s) AND counted AND reason = 'first'",
        ids,
    )
    assert counted == 120
    # One look per signal: none was looked at twice for its first look.
    assert db_scalar(stack, "SELECT count(*) FROM checks WHERE signal_id = ANY(%s)", ids) == 120


@pytest.mark.providers
def test_a_burst_of_creates_sends_one_task_that_looks_at_every_signal(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """250 creates of a polled provider's signals while no worker runs leave
    one task in the queue (250 without tickets). Started, the worker's one
    check takes a batch of 200 and sends one more for the rest: every signal
    gets its first look, with no sweep running to re-send anything."""
    # A ticket lapses after SIGNALBOX_REQUEUE_AFTER_SECONDS (20 s), as its task
    # may be lost: on a loaded machine 250 creates can take longer, and the
    # next create then rightly sends a second task. Nothing here re-sends.
    stack = stack_factory({"SIGNALBOX_REQUEUE_AFTER_SECONDS": "600"})
    _with_maildev(stack, maildev)
    stack.start(worker=False, beat=False)
    ids = _create_many(stack, 250, clients=8, provider="md")
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    assert broker.llen("signals") == 1

    stack.start_worker()

    wait_until(lambda: _first_looks(stack, ids) == 250, 60, what="every first look")


@pytest.mark.providers
def test_concurrent_creates_each_get_their_first_look_without_the_sweep(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """16 clients create a polled provider's signals while the worker runs:
    a create refused the ticket asks for it after its commit, so the
    holder's check (which hands the ticket back before it takes its batch)
    sees it. Without beat nothing is re-sent: a signal left out would never
    get its first look."""
    stack = stack_factory()
    _with_maildev(stack, maildev)
    stack.start(beat=False)
    ids = _create_many(stack, 240, clients=16, provider="md")

    wait_until(lambda: _first_looks(stack, ids) == 240, 60, what="every first look")
    tasks = [
        line
        for line in stack.log_text("worker").splitlines()
        if "Task signalbox.check[" in line and "] received" in line
    ]
    assert 0 < len(tasks) < 240, len(tasks)
