"""Signal views on a real PostgreSQL: the same view whichever way the row was
read, and only the statements a status needs."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from app.db import checks as checks_db
from app.db import claims as claims_db
from app.db import dead_letters as dead_letters_db
from app.db import messages as messages_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db.engine import transaction
from app.usecases import views

pytestmark = pytest.mark.integration

NS = "views-ns"


class Statements:
    """Counts the SQL statements an engine runs while `counting` is set."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        self.counting = False
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        if self.counting:
            self.count += 1


def _signal(engine: Engine) -> str:
    signal_id = f"sig_{uuid.uuid4().hex[:24]}"
    with transaction(engine) as s:
        signals_db.signal_create(
            s,
            {
                "id": signal_id,
                "namespace": NS,
                "idempotency_key": signal_id,
                "run_id": "run-views",
                "test_case": signal_id,
                "recipient": f"{signal_id}@example.test",
                "subject_contains": "Verify",
                "body_contains": None,
                "received_after": None,
                "now": server_db.db_now(s),
                "expires_in": 120.0,
                "max_checks": 30,
                "provider": "sink",
                "require_run_marker": False,
                "metadata": {"k": "v"},
                "max_claims": 3,
            },
            1.0,  # idempotency key hours
        )
    return signal_id


def _found(engine: Engine) -> tuple[str, str]:
    signal_id = _signal(engine)
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    with transaction(engine) as s:
        messages_db.message_record_new(
            s,
            "sink",
            [
                {
                    "id": message_id,
                    "provider": "sink",
                    "provider_message_id": message_id,
                    "received_at": server_db.db_now(s),
                    "subject": "Verify your address",
                    "recipients": [f"{signal_id}@example.test"],
                    "run_marker": "run-views",
                    "size": 10,
                    "raw": b"Subject: x\r\n\r\nhi",
                }
            ],
        )
        check = checks_db.CheckRecord(
            reason="first",
            outcome="matched",
            error_code=None,
            batch_id=None,
            started_at=server_db.db_now(s),
            counted=True,
            messages_seen=1,
        )
        assert checks_db.signal_mark_found(s, signal_id, 0, message_id, check)
    return signal_id, message_id


def _claimed(engine: Engine) -> tuple[str, str]:
    signal_id, message_id = _found(engine)
    claim_id = f"clm_{uuid.uuid4().hex[:24]}"
    with transaction(engine) as s:
        taken = claims_db.claim_take(
            s, signal_id, NS, run_id="run-views", claim_id=claim_id, lease_seconds=90
        )
        assert taken["claim_id"] == claim_id and taken["message_id"] == message_id
    return signal_id, claim_id


def _consumed(engine: Engine) -> str:
    signal_id, claim_id = _claimed(engine)
    with transaction(engine) as s:
        claim = claims_db.claim_lock_live(s, claim_id)
        assert claim is not None
        receipt = claims_db.claim_consume(
            s,
            claim,
            {"id": f"rcp_{uuid.uuid4().hex[:24]}", "evidence": {"recipient": "matched"}},
        )
        assert receipt["id"] is not None  # written
    return signal_id


def _expired(engine: Engine) -> str:
    signal_id = _signal(engine)
    with transaction(engine) as s:
        row = signals_db.signal_expire(s, signal_id, expected="waiting", reason="deadline")
        assert row is not None
        dead_letters_db.dead_letter_insert(
            s,
            {
                "id": f"dlq_{uuid.uuid4().hex[:24]}",
                "signal_id": signal_id,
                "generation": row["generation"],
                "namespace": NS,
                "run_id": "run-views",
                "provider": "sink",
                "reason": "deadline",
                "checks_total": 0,
                "checks_by_outcome": {},
                "last_error_code": None,
                "near_misses": [],
                "recommendation": "raise expires_in_seconds",
            },
        )
    return signal_id


def _both_views(engine: Engine, signal_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    with transaction(engine) as s:
        plain = signals_db.signal_get(s, signal_id, NS)
        joined = signals_db.signal_view_get(s, signal_id, NS)
        assert plain is not None and joined is not None
        return views.signal_views(s, [plain])[0], views.signal_views(s, [joined])[0]


def test_a_view_is_the_same_whether_read_plain_or_with_its_parts_joined(engine: Engine) -> None:
    for signal_id in (
        _signal(engine),
        _found(engine)[0],
        _claimed(engine)[0],
        _consumed(engine),
        _expired(engine),
    ):
        plain, joined = _both_views(engine, signal_id)
        # The clock moved between the two reads; the rest must be equal.
        plain_retry, joined_retry = (
            plain.pop("retry_after_seconds"),
            joined.pop("retry_after_seconds"),
        )
        assert plain == joined
        assert (plain_retry is None) == (joined_retry is None)


def test_each_status_shows_what_it_should(engine: Engine) -> None:
    waiting, _ = _both_views(engine, _signal(engine))
    assert waiting["retry_after_seconds"] is not None and waiting["message"] is None
    found_id, message_id = _found(engine)
    found, _ = _both_views(engine, found_id)
    assert found["message"]["message_id"] == message_id and found["claim"] is None
    assert found["retry_after_seconds"] is None
    claimed_id, claim_id = _claimed(engine)
    claimed, _ = _both_views(engine, claimed_id)
    assert claimed["claim"]["claim_id"] == claim_id and claimed["receipt"] is None
    consumed, _ = _both_views(engine, _consumed(engine))
    assert consumed["receipt"]["evidence"] == {"recipient": "matched"}
    assert consumed["claim"] is None
    expired, _ = _both_views(engine, _expired(engine))
    assert expired["dead_letter"]["reason"] == "deadline" and expired["message"] is None


def test_a_waiting_or_found_view_read_with_its_parts_joined_needs_no_more_statements(
    engine: Engine,
) -> None:
    statements = Statements(engine)
    for signal_id in (_signal(engine), _found(engine)[0]):
        with transaction(engine) as s:
            row = signals_db.signal_view_get(s, signal_id, NS)
            assert row is not None
            statements.counting, statements.count = True, 0
            views.signal_views(s, [row])
            statements.counting = False
        assert statements.count == 0, signal_id


def test_a_plain_read_asks_only_what_the_status_needs(engine: Engine) -> None:
    statements = Statements(engine)
    expected = {
        _signal(engine): 1,  # the clock
        _found(engine)[0]: 1,  # the message
        _claimed(engine)[0]: 2,  # the message and the active claim
        _consumed(engine): 2,  # the message and the receipt
        _expired(engine): 1,  # the dead letter
    }
    for signal_id, count in expected.items():
        with transaction(engine) as s:
            row = signals_db.signal_get(s, signal_id, NS)
            assert row is not None
            statements.counting, statements.count = True, 0
            views.signal_views(s, [row])
            statements.counting = False
        assert statements.count == count, (signal_id, statements.count)


def test_a_list_of_mixed_statuses_gets_every_part(engine: Engine) -> None:
    ids = [_signal(engine), _found(engine)[0], _claimed(engine)[0], _consumed(engine)]
    ids.append(_expired(engine))
    with transaction(engine) as s:
        rows = signals_db.signal_rows_many(s, ids)
        listed = {v["signal_id"]: v for v in views.signal_views(s, rows)}
    assert listed[ids[0]]["retry_after_seconds"] is not None
    assert listed[ids[1]]["message"] is not None
    assert listed[ids[2]]["claim"] is not None
    assert listed[ids[3]]["receipt"] is not None
    assert listed[ids[4]]["dead_letter"] is not None


def test_retry_after_counts_from_the_database_clock(engine: Engine) -> None:
    signal_id = _signal(engine)
    with transaction(engine) as s:
        s.execute(
            text("UPDATE signals SET next_check_at = clock_timestamp() + :d WHERE id = :id"),
            {"d": timedelta(seconds=4), "id": signal_id},
        )
    plain, joined = _both_views(engine, signal_id)
    # A sink signal: within the 5 s cap of a pushing provider's polling hint.
    assert 3 <= plain["retry_after_seconds"] <= 5
    assert 3 <= joined["retry_after_seconds"] <= 5


def test_a_signal_is_not_read_with_its_parts_from_another_namespace(engine: Engine) -> None:
    signal_id = _found(engine)[0]
    with transaction(engine) as s:
        assert signals_db.signal_view_get(s, signal_id, "another-ns") is None
        assert signals_db.signal_view_get(s, signal_id, NS) is not None
        assert signals_db.signal_view_get(s, "sig_missing", None) is None
