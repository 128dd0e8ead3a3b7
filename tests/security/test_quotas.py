"""The waiting-signal quota per namespace, under real concurrency."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import psycopg
import pytest

from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration

LIMIT = 5


def signal_body(run_id: str, test_case: str) -> dict[str, object]:
    return {"run_id": run_id, "test_case": test_case, "recipient": "quota@example.test"}


def waiting(stack: Stack, namespace: str) -> int:
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT count(*) FROM signals WHERE namespace = %s AND status = 'waiting'",
            (namespace,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def quota_stack(stack_factory: Callable[..., Stack]) -> Stack:
    stack = stack_factory({"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(LIMIT)})
    stack.start_api()  # no worker: every signal stays waiting
    return stack


def test_twenty_concurrent_creates_at_a_quota_of_five_make_exactly_five(
    quota_stack: Stack,
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    barrier = threading.Barrier(20)
    answers: list[tuple[int, str | None, str]] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        with quota_stack.client() as api:
            barrier.wait()
            r = api.post("/v1/signals", json=signal_body(run_id, f"case-{i}"))
        code = r.json().get("error", {}).get("code", "")
        with lock:
            answers.append((r.status_code, r.headers.get("Retry-After"), code))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    codes = sorted(code for code, _, _ in answers)
    assert codes == [201] * LIMIT + [429] * (20 - LIMIT), codes
    refused = [a for a in answers if a[0] == 429]
    assert all(code == "too_many_waiting" for _, _, code in refused)
    assert all(retry is not None and int(retry) >= 1 for _, retry, _ in refused)
    assert waiting(quota_stack, "default") == LIMIT


def test_at_the_quota_a_replay_still_answers_and_other_namespaces_still_create(
    quota_stack: Stack,
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with quota_stack.client() as api:
        first = api.post("/v1/signals", json=signal_body(run_id, "case-0"))
        for i in range(1, LIMIT):
            assert api.post("/v1/signals", json=signal_body(run_id, f"case-{i}")).status_code == 201
        over = api.post("/v1/signals", json=signal_body(run_id, "one-too-many"))
        replay = api.post("/v1/signals", json=signal_body(run_id, "case-0"))
    assert over.status_code == 429
    assert replay.status_code == 202
    assert replay.json()["signal_id"] == first.json()["signal_id"]
    with quota_stack.client(TOKENS["other"]) as other:
        assert other.post("/v1/signals", json=signal_body(run_id, "case-0")).status_code == 201


def test_a_signal_that_stops_waiting_frees_a_place(quota_stack: Stack) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with quota_stack.client() as api:
        ids = [
            api.post("/v1/signals", json=signal_body(run_id, f"case-{i}")).json()["signal_id"]
            for i in range(LIMIT)
        ]
        assert api.post("/v1/signals", json=signal_body(run_id, "more")).status_code == 429
        with psycopg.connect(quota_stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
            # Stands in for a worker expiring it: only the count matters here.
            conn.execute("UPDATE signals SET status = 'expired' WHERE id = %s", (ids[0],))
        assert api.post("/v1/signals", json=signal_body(run_id, "more")).status_code == 201


def test_concurrent_creates_across_the_one_statement_bound_stop_exactly_at_the_quota(
    stack_factory: Callable[..., Stack],
) -> None:
    """Far from the quota a create is one statement that counts in parallel;
    within QUOTA_SLACK (64) of it, creates count one at a time. With a quota
    of 70, 100 concurrent creates cross from one to the other: exactly 70."""
    limit = 70
    stack = stack_factory({"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(limit)})
    stack.start_api()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    barrier = threading.Barrier(25)
    statuses: list[int] = []
    lock = threading.Lock()

    def create(worker: int) -> None:
        with stack.client() as api:
            barrier.wait()
            for i in range(4):
                r = api.post("/v1/signals", json=signal_body(run_id, f"case-{worker}-{i}"))
                with lock:
                    statuses.append(r.status_code)

    threads = [threading.Thread(target=create, args=(w,)) for w in range(25)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == [201] * limit + [429] * (100 - limit)
    assert waiting(stack, "default") == limit
