"""When the sweep may expire a waiting signal past its deadline, on a real
PostgreSQL: after a final look that saw the provider at once, after failed
final looks once the grace is over, and, when no final look could begin (every
worker busy), only after several graces, so mail held before the deadline is
not lost to a saturated pool."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from app.db import due as due_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db.engine import transaction

pytestmark = pytest.mark.integration

GRACE = 10.0


def _past_deadline(
    engine: Engine,
    *,
    deadline_ago: float,
    looked_after_deadline: float | None,
    outcome: str | None,
    leased: bool = False,
) -> str:
    """A waiting signal whose deadline was `deadline_ago` s ago and whose last
    look began `looked_after_deadline` s after it (None: before it)."""
    signal_id = f"sig_{uuid.uuid4().hex[:24]}"
    with transaction(engine) as s:
        signals_db.signal_create(
            s,
            {
                "id": signal_id,
                "namespace": "expiry-rule",
                "idempotency_key": signal_id,
                "run_id": "run-expiry",
                "test_case": signal_id,
                "recipient": f"{signal_id}@example.test",
                "subject_contains": "Verify",
                "body_contains": None,
                "received_after": None,
                "now": server_db.db_now(s) - timedelta(seconds=120),
                "expires_in": 120.0 - deadline_ago,
                "max_checks": 30,
                "provider": "sink",
                "require_run_marker": False,
                "metadata": {},
                "max_claims": 3,
            },
            1.0,  # idempotency key hours
        )
        s.execute(
            text(
                """
                UPDATE signals SET
                    last_look_at = CASE WHEN CAST(:after AS float8) IS NULL
                        THEN expires_at - interval '2 seconds'
                        ELSE expires_at + make_interval(secs => :after) END,
                    last_outcome = :outcome,
                    check_lease_until = CASE WHEN :leased THEN now() + interval '30 seconds' END
                 WHERE id = :id
                """
            ),
            {
                "id": signal_id,
                "after": looked_after_deadline,
                "outcome": outcome,
                "leased": leased,
            },
        )
    return signal_id


def test_the_sweep_expires_only_signals_whose_final_look_is_settled(engine: Engine) -> None:
    seen_at_once = _past_deadline(
        engine, deadline_ago=2, looked_after_deadline=0.5, outcome="no_match"
    )
    failing_within_grace = _past_deadline(
        engine, deadline_ago=5, looked_after_deadline=1, outcome="provider_error"
    )
    failing_past_grace = _past_deadline(
        engine, deadline_ago=GRACE + 5, looked_after_deadline=1, outcome="provider_error"
    )
    unlooked_past_one_grace = _past_deadline(
        engine, deadline_ago=GRACE + 5, looked_after_deadline=None, outcome="no_match"
    )
    unlooked_past_all_graces = _past_deadline(
        engine,
        deadline_ago=GRACE * due_db.UNLOOKED_GRACES + 5,
        looked_after_deadline=None,
        outcome="no_match",
    )
    under_a_live_lease = _past_deadline(
        engine,
        deadline_ago=GRACE * due_db.UNLOOKED_GRACES + 5,
        looked_after_deadline=None,
        outcome="no_match",
        leased=True,
    )
    mine = {
        seen_at_once,
        failing_within_grace,
        failing_past_grace,
        unlooked_past_one_grace,
        unlooked_past_all_graces,
        under_a_live_lease,
    }

    with transaction(engine) as s:
        due = set(due_db.signal_ids_past_deadline(s, 10_000, GRACE)) & mine
        s.rollback()

    assert due == {seen_at_once, failing_past_grace, unlooked_past_all_graces}
