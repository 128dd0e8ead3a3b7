"""Helpers the integration tests share: building mail, creating signals,
reading views and rows. They talk to the real stack only."""

from __future__ import annotations

import uuid
from email.message import EmailMessage
from typing import Any

import psycopg

from tests.stack import Stack

# Alice's ops token, known to the `ops_stack` fixture's API.
OPS_TOKEN = "tok-ops-alice-0123456789"


def mail(
    to: str,
    subject: str = "Verify your account",
    run: str | None = None,
    body: str = "Your code is 493817",
) -> bytes:
    """A plain message to `to`, with the run marker header when `run` is given."""
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = to
    msg["Subject"] = subject
    if run is not None:
        msg["X-Signalbox-Run"] = run
    msg.set_content(body)
    return bytes(msg)


def create_signal(stack: Stack, **fields: object) -> dict[str, Any]:
    """POST /v1/signals with fresh run, test case and recipient unless given; expects 201."""
    payload = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": f"case-{uuid.uuid4().hex[:6]}",
        "recipient": f"user-{uuid.uuid4().hex[:8]}@example.test",
        **fields,
    }
    with stack.client() as api:
        response = api.post("/v1/signals", json=payload)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def signal_view(stack: Stack, signal_id: str, wait: int = 0) -> dict[str, Any]:
    """GET /v1/signals/{id}?wait=N (a long poll when N > 0)."""
    with stack.client() as api:
        response = api.get(f"/v1/signals/{signal_id}", params={"wait": wait})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def wait_result(stack: Stack, signal_id: str, wait: int = 20) -> dict[str, Any]:
    """The view once its result leaves waiting/provider_error, or after `wait` s."""
    return signal_view(stack, signal_id, wait=wait)


def db_rows(stack: Stack, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"], autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def db_scalar(stack: Stack, sql: str, *params: object) -> Any:
    rows = db_rows(stack, sql, *params)
    assert rows, sql
    return rows[0][0]


def insert_sink_message(stack: Stack, recipient: str, raw: bytes | None = None) -> int:
    """Put a message into the sink's store WITHOUT the push an SMTP delivery
    makes: the sink then behaves as a polled provider, and only a scheduled
    check can see the message. Returns its sink id."""
    data = raw if raw is not None else mail(recipient)
    rows = db_rows(
        stack,
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw)"
        " VALUES ('app@example.test', %s, %s, %s, %s) RETURNING id",
        [recipient.lower()],
        [recipient.lower()],
        len(data),
        data,
    )
    return int(rows[0][0])
