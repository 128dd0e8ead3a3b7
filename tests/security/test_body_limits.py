"""Request bodies: 401 before a byte is read, 413 over the limit, streamed or not."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.security.rawhttp import request
from tests.stack import Stack

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


def signal_body(**fields: object) -> dict[str, object]:
    return {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": "test_limits",
        "recipient": "limits@example.test",
        **fields,
    }


def pieces(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        yield b" " * n
        sent += n


def test_unauthenticated_body_gets_401_before_it_is_sent(stack: Stack) -> None:
    # Ten megabytes announced, not one byte sent: the answer can only come
    # from a server that does not wait for (or read) the body.
    answer = request(
        stack.api_port,
        "POST",
        "/v1/signals",
        headers={"Content-Type": "application/json", "Content-Length": str(10 * MIB)},
    )
    assert answer.status == 401
    assert answer.json()["error"]["code"] == "unauthorized"
    assert answer.headers["www-authenticate"] == "Bearer"


def test_unauthenticated_ten_megabytes_sent_in_full_get_401_and_the_api_stays_healthy(
    stack: Stack,
) -> None:
    answer = request(
        stack.api_port,
        "POST",
        "/v1/signals",
        headers={"Content-Type": "application/json", "Content-Length": str(10 * MIB)},
        body=pieces(10 * MIB),
    )
    assert answer.status == 401
    assert httpx.get(f"{stack.api_url}/healthz", timeout=10).status_code == 200
    with stack.client() as api:
        assert api.post("/v1/signals", json=signal_body()).status_code == 201


def test_a_wrong_token_with_invalid_json_is_401_not_422(stack: Stack) -> None:
    r = httpx.post(
        f"{stack.api_url}/v1/signals",
        content=b"{not json",
        headers={"Authorization": "Bearer nope", "Content-Type": "application/json"},
    )
    assert r.status_code == 401


def test_two_megabytes_with_a_token_get_413_payload_too_large(stack: Stack) -> None:
    answer = request(
        stack.api_port,
        "POST",
        "/v1/signals",
        headers={
            "Authorization": f"Bearer {stack.token}",
            "Content-Type": "application/json",
            "Content-Length": str(2 * MIB),
        },
        body=pieces(2 * MIB),
    )
    assert answer.status == 413
    assert answer.json()["error"]["code"] == "payload_too_large"


def test_chunked_body_without_length_over_the_limit_gets_413(stack: Stack) -> None:
    answer = request(
        stack.api_port,
        "POST",
        "/v1/signals",
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
        body=pieces(3 * MIB),
        chunked=True,
    )
    assert answer.status == 413
    assert answer.json()["error"]["code"] == "payload_too_large"
    assert httpx.get(f"{stack.api_url}/healthz", timeout=10).status_code == 200


def test_chunked_body_under_the_limit_is_accepted(stack: Stack) -> None:
    payload = json.dumps(signal_body(metadata={"note": "x" * 3000})).encode()
    answer = request(
        stack.api_port,
        "POST",
        "/v1/signals",
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
        body=[payload[:100], payload[100:]],
        chunked=True,
    )
    assert answer.status == 201, answer.body


def test_oversize_body_on_an_unauthenticated_route_gets_413(stack: Stack) -> None:
    answer = request(
        stack.api_port,
        "POST",
        "/healthz",
        headers={"Content-Length": str(2 * MIB)},
    )
    assert answer.status == 413
