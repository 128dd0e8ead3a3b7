"""Hostile input over real HTTP: the received_after window, cursors, NULs,
and the per-process cap on long polls."""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def signal_body(**fields: object) -> dict[str, object]:
    return {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": f"test-{uuid.uuid4().hex[:6]}",
        "recipient": "bounds@example.test",
        **fields,
    }


def iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    "received_after",
    [
        "0001-01-01T00:00:00Z",
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-05:00",
        iso(datetime.now(UTC) - timedelta(hours=25)),
        iso(datetime.now(UTC) + timedelta(hours=2)),
    ],
    # Stable names: every pytest-xdist worker must collect the same tests.
    ids=["year-1", "year-1-tz", "year-9999", "year-9999-tz", "25h-ago", "2h-ahead"],
)
def test_received_after_outside_the_window_is_422_naming_it(
    stack: Stack, received_after: str
) -> None:
    with stack.client() as api:
        r = api.post("/v1/signals", json=signal_body(received_after=received_after))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "received_after"


def test_received_after_inside_the_window_is_accepted(stack: Stack) -> None:
    with stack.client() as api:
        for at in (
            datetime.now(UTC) - timedelta(hours=23),
            datetime.now(UTC) + timedelta(minutes=30),
        ):
            r = api.post("/v1/signals", json=signal_body(received_after=iso(at)))
            assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "cursor",
    [
        base64.urlsafe_b64encode(b"[" * 4000).decode(),
        "[" * 200,
        "x" * 5000,
        base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", "sig_\\u0000"]').decode(),
        base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", "sig_\\ud800"]').decode(),
    ],
)
def test_malformed_cursor_is_422_naming_cursor_on_every_list(stack: Stack, cursor: str) -> None:
    with stack.client() as api:
        for path, params in (
            ("/v1/signals", {"run_id": "run-1"}),
            ("/v1/dead-letters", {}),
        ):
            r = api.get(path, params={**params, "cursor": cursor})
            assert r.status_code == 422, (path, r.text)
            assert r.json()["error"]["field"] == "cursor"


def test_nul_characters_anywhere_are_422_never_a_server_error(stack: Stack) -> None:
    with stack.client() as api:
        answers = [
            api.post("/v1/signals", json=signal_body(test_case="a\u0000b")),
            api.post("/v1/signals", json=signal_body(metadata={"k": "\u0000"})),
            api.post("/v1/signals", json=signal_body(recipient="a\u0000@example.test")),
            api.get("/v1/signals/sig_%00"),
            api.get("/v1/signals", params={"run_id": "a\u0000"}),
            api.get("/v1/dead-letters", params={"provider": "a\u0000"}),
            api.get("/v1/runs/a%00/evidence"),
        ]
    assert [r.status_code for r in answers] == [422] * len(answers), [r.text for r in answers]


def test_long_polls_beyond_the_cap_get_429_with_retry_after(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory({"SIGNALBOX_MAX_LONG_POLLS": "2"})
    stack.start_api()  # no worker: the signals stay waiting
    with stack.client() as api:
        ids = [api.post("/v1/signals", json=signal_body()).json()["signal_id"] for _ in range(3)]
    # Two long polls held open on bare sockets, so the test can hang up on them.
    held = []
    for signal_id in ids[:2]:
        sock = socket.create_connection(("127.0.0.1", stack.api_port), timeout=30)
        sock.sendall(
            f"GET /v1/signals/{signal_id}?wait=60 HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {stack.token}\r\n\r\n".encode()
        )
        held.append(sock)

    def refused() -> httpx.Response | None:
        with stack.client() as api:
            r = api.get(f"/v1/signals/{ids[2]}", params={"wait": 1})
        return r if r.status_code == 429 else None

    r = wait_until(refused, 30, what="the third long poll to be refused")
    assert r.json()["error"]["code"] == "too_many_long_polls"
    assert int(r.headers["Retry-After"]) >= 1
    with stack.client() as api:
        # A plain read is never a long poll: it is not capped.
        assert api.get(f"/v1/signals/{ids[2]}").status_code == 200
    for sock in held:
        sock.close()

    def accepted() -> bool:
        with stack.client() as api:
            return api.get(f"/v1/signals/{ids[2]}", params={"wait": 1}).status_code == 200

    # The held polls notice their clients left and free their places.
    wait_until(accepted, 30, what="a long poll to be accepted again")
