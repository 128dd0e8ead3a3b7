"""The waiting-signal quota per namespace, under real concurrency."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg
import pytest

from tests.stack import ROOT, TOKENS, Stack

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
        # On an address of its own: the one above is held by the first namespace.
        body = {**signal_body(run_id, "case-0"), "recipient": "quota-other@example.test"}
        assert other.post("/v1/signals", json=body).status_code == 201


# ---------------------------------------------------------------- mailboxes

MAILBOX_LIMIT = 3


def test_ten_concurrent_mailbox_creates_at_a_quota_of_three_make_exactly_three(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory({"SIGNALBOX_MAX_MAILBOXES_PER_NAMESPACE": str(MAILBOX_LIMIT)})
    stack.start_api()
    codes: list[int] = []
    lock = threading.Lock()

    def create() -> None:
        with stack.client() as api:
            r = api.post("/v1/mailboxes", json={"run_id": "run-mbx"})
        with lock:
            codes.append(r.status_code)
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "too_many_mailboxes"
                assert "Retry-After" in r.headers

    threads = [threading.Thread(target=create) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [201] * MAILBOX_LIMIT + [429] * (10 - MAILBOX_LIMIT)
    # Another namespace has its own quota; a deleted mailbox frees a place.
    with stack.client(TOKENS["other"]) as other:
        assert other.post("/v1/mailboxes", json={"run_id": "run-mbx"}).status_code == 201
    with stack.client() as api, psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT id FROM mailboxes WHERE namespace = 'default' LIMIT 1"
        ).fetchone()
        assert row is not None
        assert api.delete(f"/v1/mailboxes/{row[0]}").status_code == 204
        assert api.post("/v1/mailboxes", json={"run_id": "run-mbx"}).status_code == 201


def test_an_expired_mailbox_is_deleted_and_its_mail_kept_to_the_content_horizon(
    stack_factory: Callable[..., Stack],
) -> None:
    # 9 s; the retention run (beat's, every 10 minutes) is made here.
    stack = stack_factory({"SIGNALBOX_MAILBOX_TTL_HOURS": "0.0025"})
    stack.start(worker=False, beat=False)
    with stack.client() as api:
        box = api.post("/v1/mailboxes", json={"run_id": "run-exp"}).json()
    stack.send(mail_to(box["address"]), [box["address"]])
    url = stack.env["SIGNALBOX_DATABASE_URL"]

    def state() -> tuple[bool, int]:
        with psycopg.connect(url) as conn:
            deleted = conn.execute(
                "SELECT deleted_at IS NOT NULL FROM mailboxes WHERE id = %s", (box["mailbox_id"],)
            ).fetchone()
            stored = conn.execute(
                "SELECT count(*) FROM sink_messages WHERE %s = ANY(all_recipients)",
                (box["address"],),
            ).fetchone()
        assert deleted is not None and stored is not None
        return bool(deleted[0]), int(stored[0])

    def retention_run() -> int:
        """One run of the retention task's use case, in a process of the stack's environment."""
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "from app.settings import get_settings;"
                " from app.usecases.retention import purge;"
                " print(purge(get_settings())['mailboxes'])",
            ],
            env=stack.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return int(out.stdout.strip().splitlines()[-1])

    assert state() == (False, 1)
    assert retention_run() == 0  # not expired yet
    expires = datetime.fromisoformat(box["expires_at"].replace("Z", "+00:00"))
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.5)
    assert retention_run() == 1
    # Deleted, its mail kept: a failed test's mailbox stays readable until
    # SIGNALBOX_RETENTION_HOURS (DELETE /v1/mailboxes is the purge).
    assert state() == (True, 1)
    # Its address stays the namespace's: another one may not watch it.
    with stack.client(TOKENS["other"]) as other:
        r = other.post(
            "/v1/signals", json={"run_id": "r", "test_case": "t", "recipient": box["address"]}
        )
    assert r.status_code == 403


def mail_to(address: str) -> bytes:
    return f"From: app@example.test\r\nTo: {address}\r\nSubject: hi\r\n\r\nhello\r\n".encode()


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


# ---------------------------------------------------------------- redrive


def test_redrive_single_and_bulk_honours_the_waiting_quota(
    stack_factory: Callable[..., Stack],
) -> None:
    """A redrive makes a signal waiting again, so it counts against
    SIGNALBOX_MAX_WAITING_PER_NAMESPACE like a create: at LIMIT - 1 waiting a
    bulk redrive of three moves one; then single and bulk answer 429 and the
    dead letters stay open."""
    stack = stack_factory({"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(LIMIT)})
    stack.start(smtp=False)
    doomed_run = f"run-{uuid.uuid4().hex[:8]}"
    with stack.client() as api:
        doomed = [
            api.post(
                "/v1/signals",
                json={
                    **signal_body(doomed_run, f"doomed-{i}"),
                    "recipient": f"doomed-{i}@example.test",
                    "expires_in_seconds": 1,
                },
            ).json()["signal_id"]
            for i in range(3)
        ]
        dead_letters = []
        for signal_id in doomed:
            view = api.get(f"/v1/signals/{signal_id}", params={"wait": 30}).json()
            assert view["status"] == "expired", view
            dead_letters.append(view["dead_letter"]["dead_letter_id"])
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        for i in range(LIMIT - 1):
            r = api.post(
                "/v1/signals", json={**signal_body(run_id, f"w-{i}"), "expires_in_seconds": 600}
            )
            assert r.status_code == 201, r.text
        bulk = api.post("/v1/dead-letters/redrive", json={"filter": {"run_id": doomed_run}})
        assert bulk.status_code == 200, bulk.text
        assert bulk.json()["count"] == 1
        assert waiting(stack, "default") == LIMIT
        still_open = [
            d for d in dead_letters if api.get(f"/v1/dead-letters/{d}").json()["state"] == "open"
        ]
        assert len(still_open) == 2
        single = api.post(f"/v1/dead-letters/{still_open[0]}/redrive", json={})
        assert single.status_code == 429, single.text
        assert single.json()["error"]["code"] == "too_many_waiting"
        assert int(single.headers["Retry-After"]) >= 1
        again = api.post("/v1/dead-letters/redrive", json={"filter": {"run_id": doomed_run}})
        assert again.status_code == 429, again.text
        assert all(api.get(f"/v1/dead-letters/{d}").json()["state"] == "open" for d in still_open)
    assert waiting(stack, "default") == LIMIT
