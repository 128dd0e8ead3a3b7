"""Flower (`signalbox-server flower`) behind basic auth shows the workers,
the `signals` and `dead_letter` queues and the task names."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.servers import free_port
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

TASKS = {"signalbox.check", "signalbox.sweep", "signalbox.retention", "signalbox.dead_letter"}


def test_flower_shows_workers_queues_and_tasks_only_with_credentials(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory()
    stack.start_worker()
    port = free_port()
    stack.spawn(
        "flower",
        ["flower"],
        extra_env={"SIGNALBOX_FLOWER_PORT": str(port), "SIGNALBOX_FLOWER_BASIC_AUTH": "ops:secret"},
    )
    base = f"http://127.0.0.1:{port}"

    def workers() -> dict | None:
        try:
            response = httpx.get(
                f"{base}/api/workers", params={"refresh": "1"}, auth=("ops", "secret"), timeout=10
            )
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 and response.json() else None

    seen = wait_until(workers, 40, interval=0.5, what="Flower to list the worker")

    ((name, info),) = [(n, i) for n, i in seen.items() if n.startswith("worker-")]
    assert set(info["registered"]) >= TASKS
    assert {q["name"] for q in info["active_queues"]} == {"signals", "dead_letter"}

    queues = httpx.get(f"{base}/api/queues/length", auth=("ops", "secret"), timeout=10)
    assert queues.status_code == 200
    assert {"signals", "dead_letter"} <= {q["name"] for q in queues.json()["active_queues"]}

    assert httpx.get(f"{base}/api/workers", timeout=10).status_code == 401
    assert httpx.get(f"{base}/api/workers", auth=("ops", "wrong"), timeout=10).status_code == 401
    assert httpx.get(f"{base}/workers", timeout=10).status_code == 401

    # The UI lists workers from the event stream (heartbeats every 2 s), which
    # reaches Flower a moment after the inspect answer above.
    def in_ui() -> bool:
        ui = httpx.get(f"{base}/workers", params={"json": "1"}, auth=("ops", "secret"), timeout=10)
        assert ui.status_code == 200
        return name in ui.text

    wait_until(in_ui, 30, interval=0.5, what="Flower's UI to list the worker")
