"""What a new user meets in the first hour, on the real stack: the polling
hint of a waiting signal."""

from __future__ import annotations

import pytest

from tests.integration.helpers import create_signal, signal_view
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

# docs/api.md: a pending sink signal's retry_after_seconds is at most 5.
PUSH_HINT_MAX = 5


def test_a_waiting_sink_signal_says_look_again_soon_not_at_its_deadline(stack: Stack) -> None:
    # The sink pushes every arrival, so its next scheduled check is the deadline;
    # the hint must not tell a caller to sleep until then (the mail may come in 3 s).
    signal = create_signal(stack, expires_in_seconds=120)
    sid = signal["signal_id"]
    wait_until(lambda: signal_view(stack, sid)["last_check"], 30, what="the first check")
    view = signal_view(stack, sid, wait=3)
    assert view["result"] == "waiting"
    assert 1 <= view["retry_after_seconds"] <= PUSH_HINT_MAX
    with stack.client() as api:
        early = api.post(f"/v1/signals/{sid}/claim", json={"run_id": signal["run_id"]})
    assert early.status_code == 202, early.text
    assert 1 <= early.json()["retry_after_seconds"] <= PUSH_HINT_MAX
