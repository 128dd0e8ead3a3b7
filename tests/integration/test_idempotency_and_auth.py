"""Idempotent creation under real concurrency, tokens and namespaces, bad input."""

from __future__ import annotations

import threading
import uuid

import httpx
import psycopg
import pytest

from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def body(**fields: object) -> dict[str, object]:
    return {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": "test_signup",
        "recipient": "someone@example.test",
        **fields,
    }


def signal_count(stack: Stack) -> int:
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        return int(conn.execute("SELECT count(*) FROM signals").fetchone()[0])


def test_fifty_concurrent_identical_creates_make_exactly_one_signal(stack: Stack) -> None:
    payload = body()
    barrier = threading.Barrier(50)
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def create() -> None:
        with httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=60
        ) as api:
            barrier.wait()
            r = api.post("/v1/signals", json=payload)
        with lock:
            answers.append((r.status_code, r.json().get("signal_id", r.text)))

    threads = [threading.Thread(target=create) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    codes = sorted(code for code, _ in answers)
    assert codes.count(201) == 1, codes
    assert set(codes) <= {200, 201, 202}, codes
    assert len({sid for _, sid in answers}) == 1
    assert signal_count(stack) == 1


def test_same_key_answers_202_while_waiting_and_200_after(stack: Stack) -> None:
    """A create repeated with the same key answers the one signal: 202 while
    it waits, 200 once it has stopped waiting."""
    payload = body(expires_in_seconds=1, max_checks=1)
    with stack.client() as api:
        first = api.post("/v1/signals", json=payload)
        again = api.post("/v1/signals", json=payload)
        assert first.status_code == 201 and again.status_code in (200, 202)
        sid = first.json()["signal_id"]
        assert again.json()["signal_id"] == sid
        # Until it is expired, whenever that is: while it waits the same key
        # still answers 202.
        wait_until(
            lambda: api.get(f"/v1/signals/{sid}", params={"wait": 5}).json()["status"] == "expired",
            30,
            what="the signal to expire",
        )
        later = api.post("/v1/signals", json=payload)
    assert later.status_code == 200
    assert later.json()["status"] == "expired"


def test_idempotency_key_header_wins_over_run_and_test_case(stack: Stack) -> None:
    with stack.client() as api:
        a = api.post("/v1/signals", json=body(test_case="a"), headers={"Idempotency-Key": "k-1"})
        b = api.post("/v1/signals", json=body(test_case="a"), headers={"Idempotency-Key": "k-2"})
    assert a.status_code == 201 and b.status_code == 201
    assert a.json()["signal_id"] != b.json()["signal_id"]


def test_same_key_with_a_different_recipient_is_an_idempotency_conflict(stack: Stack) -> None:
    payload = body()
    with stack.client() as api:
        assert api.post("/v1/signals", json=payload).status_code == 201
        r = api.post("/v1/signals", json={**payload, "recipient": "other@example.test"})
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "idempotency_conflict"
    assert signal_count(stack) == 1


def test_a_lapsed_key_creates_a_new_signal(stack: Stack) -> None:
    payload = body()
    with stack.client() as api:
        first = api.post("/v1/signals", json=payload).json()
        with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
            conn.execute("UPDATE idempotency_keys SET expires_at = now() - interval '1 second'")
        second = api.post("/v1/signals", json=payload)
    assert second.status_code == 201
    assert second.json()["signal_id"] != first["signal_id"]


def test_request_without_token_gets_401(stack: Stack) -> None:
    r = httpx.post(f"{stack.api_url}/v1/signals", json=body())
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized"
    r = httpx.get(f"{stack.api_url}/v1/signals/sig_x", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_another_namespace_gets_404_for_a_signal(stack: Stack) -> None:
    payload = body()
    with stack.client() as api:
        signal_id = api.post("/v1/signals", json=payload).json()["signal_id"]
        own_evidence = api.get(f"/v1/runs/{payload['run_id']}/evidence")
        own_list = api.get("/v1/signals", params={"run_id": payload["run_id"]}).json()
    with stack.client(TOKENS["other"]) as other:
        r = other.get(f"/v1/signals/{signal_id}")
        claim = other.post(f"/v1/signals/{signal_id}/claim", json={"run_id": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert claim.status_code == 404
    with stack.client() as api:
        box = api.post("/v1/mailboxes", json={"run_id": "r"}).json()
    with stack.client(TOKENS["other"]) as other:
        assert other.delete(f"/v1/mailboxes/{box['mailbox_id']}").status_code == 404
        assert other.get(f"/v1/runs/{payload['run_id']}/evidence").status_code == 404
        other_list = other.get("/v1/signals", params={"run_id": payload["run_id"]}).json()
    assert own_evidence.status_code == 200 and len(own_list["items"]) == 1
    assert other_list["items"] == []


def test_token_created_by_the_cli_authenticates_its_namespace(stack: Stack) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "token", "create", "--namespace", "team-a"],
        env=stack.env,
        capture_output=True,
        text=True,
        check=True,
    )
    token = out.stdout.strip()
    with stack.client(token) as api:
        r = api.post("/v1/signals", json=body())
    assert r.status_code == 201
    with stack.client() as default:
        assert default.get(f"/v1/signals/{r.json()['signal_id']}").status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"recipient": "not-an-address"}, "recipient"),
        ({"run_id": "has spaces"}, "run_id"),
        ({"expires_in_seconds": 0}, "expires_in_seconds"),
        ({"max_checks": 10001}, "max_checks"),
        ({"test_case": ""}, "test_case"),
        ({"metadata": {"x": "y" * 5000}}, "metadata"),
        ({"received_after": "2026-01-01T00:00:00"}, "received_after"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"provider": "nope"}, "provider"),
    ],
)
def test_invalid_fields_get_422_naming_the_field_and_store_nothing(
    stack: Stack, change: dict[str, object], field: str
) -> None:
    with stack.client() as api:
        r = api.post("/v1/signals", json=body(**change))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    assert signal_count(stack) == 0


def test_invalid_json_gets_422(stack: Stack) -> None:
    with stack.client() as api:
        r = api.post(
            "/v1/signals", content=b"{not json", headers={"Content-Type": "application/json"}
        )
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_input"


def test_openapi_document_is_served(stack: Stack) -> None:
    doc = httpx.get(f"{stack.api_url}/openapi.json").json()
    assert "/v1/signals" in doc["paths"]
    assert "/v1/signals/{signal_id}/claim" in doc["paths"]


def test_list_limit_above_500_is_refused_naming_limit(stack: Stack) -> None:
    with stack.client() as api:
        r = api.get("/v1/signals", params={"run_id": "r", "limit": 501})
        bad_cursor = api.get("/v1/signals", params={"run_id": "r", "cursor": "garbage!"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"
    with stack.client() as api:
        too_long = api.get("/v1/signals/sig_x", params={"wait": 61})
    assert too_long.status_code == 422 and too_long.json()["error"]["field"] == "wait"
    assert bad_cursor.status_code == 422 and bad_cursor.json()["error"]["field"] == "cursor"
