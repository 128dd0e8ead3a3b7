"""The waiting-quota count kept by a trigger (`namespace_waiting`) agrees
with the signals themselves after real lifecycles made concurrently by many
clients and processes: creates, finds, claims, consumes and expiries."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.helpers import create_signal, db_rows, mail, wait_result
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def counts_by_trigger(stack: Stack) -> dict[str, int]:
    rows = db_rows(
        stack,
        "SELECT namespace, sum(waiting) FROM namespace_waiting GROUP BY namespace"
        " HAVING sum(waiting) <> 0",
    )
    return {ns: int(n) for ns, n in rows}


def counts_by_scan(stack: Stack) -> dict[str, int]:
    rows = db_rows(
        stack, "SELECT namespace, count(*) FROM signals WHERE status = 'waiting' GROUP BY 1"
    )
    return {ns: int(n) for ns, n in rows}


def lifecycle(stack: Stack, i: int) -> str:
    """Create; then, by i: leave waiting, find, find + claim + consume, or let expire."""
    fate = i % 4
    signal = create_signal(stack, expires_in_seconds=2 if fate == 3 else 120, max_checks=50)
    if fate in (1, 2):
        stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])
        assert wait_result(stack, signal["signal_id"])["status"] == "found"
    if fate == 2:
        with stack.client() as api:
            claim = api.post(
                f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
            )
            assert claim.status_code == 200, claim.text
            consumed = api.post(f"/v1/claims/{claim.json()['claim_id']}/consume")
            assert consumed.status_code == 200, consumed.text
    return str(signal["signal_id"])


def test_the_trigger_kept_count_agrees_with_the_signals_after_concurrent_lifecycles(
    stack: Stack,
) -> None:
    with ThreadPoolExecutor(12) as pool:
        ids = list(pool.map(lambda i: lifecycle(stack, i), range(48)))
    assert len(set(ids)) == 48
    # The expiring ones leave `waiting` through the sweep.
    wait_until(
        lambda: counts_by_scan(stack).get("default", 0) == 12,
        60,
        what="the short-lived signals to expire",
    )
    assert counts_by_trigger(stack) == counts_by_scan(stack) == {"default": 12}

    # Another namespace has a count of its own.
    with stack.client(TOKENS["other"]) as api:
        other = api.post(
            "/v1/signals",
            json={
                "run_id": "run-other",
                "test_case": "case",
                "recipient": f"o-{uuid.uuid4().hex[:8]}@example.test",
            },
        )
    assert other.status_code == 201, other.text
    assert counts_by_trigger(stack) == counts_by_scan(stack) == {"default": 12, "other": 1}
