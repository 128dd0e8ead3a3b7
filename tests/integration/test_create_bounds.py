"""`received_after` is judged against the database's clock at the create, on
both sides of each bound and within the second around it (where the
one-statement create steps aside and the transaction decides)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.stack import Stack

pytestmark = pytest.mark.integration

LOOKBACK = timedelta(hours=24)  # the defaults
LOOKAHEAD = timedelta(hours=1)


def _create(stack: Stack, received_after: datetime) -> tuple[int, dict]:
    body = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": "bounds",
        "recipient": f"user-{uuid.uuid4().hex[:8]}@example.test",
        "received_after": received_after.isoformat(),
    }
    with stack.client() as api:
        response = api.post("/v1/signals", json=body)
    return response.status_code, response.json()


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [
        (-LOOKBACK + timedelta(seconds=5), True),  # clear: one statement
        (-LOOKBACK + timedelta(seconds=0.5), True),  # within the margin: the transaction
        (-LOOKBACK - timedelta(seconds=0.5), False),
        (-LOOKBACK - timedelta(seconds=5), False),
        (LOOKAHEAD - timedelta(seconds=5), True),
        (LOOKAHEAD - timedelta(seconds=0.5), True),  # the clock moves on: still inside
        (LOOKAHEAD + timedelta(seconds=0.5), False),
        (LOOKAHEAD + timedelta(seconds=5), False),
    ],
)
def test_received_after_is_judged_at_each_bound(
    stack: Stack, offset: timedelta, accepted: bool
) -> None:
    status, body = _create(stack, datetime.now(UTC) + offset)
    if accepted:
        assert status == 201, body
        assert body["status"] == "waiting"
    else:
        assert status == 422, body
        assert body["error"]["field"] == "received_after"
