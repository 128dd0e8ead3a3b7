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
    provider: str = "sink",
) -> str:
    """A waiting signal whose deadline was `deadline_ago` s ago and whose last
    look began `looked_after_deadline` s after it (None: before it)."""
    signal_id = f"sig_{uuid.uuid4().hex[:24]}"
    age = max(120.0, deadline_ago + 60.0)
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
                "now": server_db.db_now(s) - timedelta(seconds=age),
                "expires_in": age - deadline_ago,
                "max_checks": 30,
                "provider": provider,
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


def _mail_to(engine: Engine, signal_id: str, at: str, *, address: str | None = None) -> None:
    """A sink message (no push) to the signal's recipient, or `address`,
    received at `at`: SQL over the signal's row `s`."""
    with transaction(engine) as s:
        s.execute(
            text(
                "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients,"
                " size, raw, received_at)"
                f" SELECT 'app@example.test', ARRAY[a], ARRAY[a], 1, 'x'::bytea, {at}"
                " FROM signals s,"
                "      LATERAL (SELECT coalesce(CAST(:address AS text), s.recipient) AS a) r"
                " WHERE s.id = :id"
            ),
            {"id": signal_id, "address": address},
        )


def test_a_sink_signal_is_not_given_up_unlooked_while_the_sink_holds_its_mail(
    engine: Engine,
) -> None:
    """Overload: the final looks wait behind a backlog past every grace. A
    sink signal whose address has mail in its window is not expired unseen
    (its look, once made, finds the mail); one with no such mail is, and so
    is the held one once HELD_MAIL_GRACES have passed, so a deadline ends."""
    past_all = GRACE * due_db.UNLOOKED_GRACES + 5

    def unlooked(deadline_ago: float = past_all, provider: str = "sink") -> str:
        return _past_deadline(
            engine,
            deadline_ago=deadline_ago,
            looked_after_deadline=None,
            outcome="no_match",
            provider=provider,
        )

    held = unlooked()
    _mail_to(engine, held, "s.expires_at - interval '2 seconds'")
    at_the_window_edges = unlooked()
    _mail_to(engine, at_the_window_edges, "s.received_after")
    _mail_to(engine, at_the_window_edges, "s.expires_at")
    nothing_held = unlooked()
    to_another_address = unlooked()
    _mail_to(
        engine, to_another_address, "s.expires_at - interval '2 seconds'", address="x@example.test"
    )
    before_the_window = unlooked()
    _mail_to(engine, before_the_window, "s.received_after - interval '5 seconds'")
    after_the_deadline = unlooked()
    _mail_to(engine, after_the_deadline, "s.expires_at + interval '5 seconds'")
    held_past_its_bound = unlooked(GRACE * due_db.HELD_MAIL_GRACES + 5)
    _mail_to(engine, held_past_its_bound, "s.expires_at - interval '2 seconds'")
    polled = unlooked(provider="imap")  # its mail is not the sink's: no look here finds it
    _mail_to(engine, polled, "s.expires_at - interval '2 seconds'")
    looked_and_saw_nothing = _past_deadline(
        engine, deadline_ago=past_all, looked_after_deadline=0.5, outcome="no_match"
    )
    _mail_to(engine, looked_and_saw_nothing, "s.expires_at - interval '2 seconds'")
    mine = {
        held,
        at_the_window_edges,
        nothing_held,
        to_another_address,
        before_the_window,
        after_the_deadline,
        held_past_its_bound,
        polled,
        looked_and_saw_nothing,
    }

    with transaction(engine) as s:
        due = set(due_db.signal_ids_past_deadline(s, 10_000, GRACE, ["sink"])) & mine
        without_sinks = set(due_db.signal_ids_past_deadline(s, 10_000, GRACE)) & mine
        s.rollback()

    assert due == mine - {held, at_the_window_edges}
    assert without_sinks == mine


def test_the_held_mail_probe_reads_the_address_from_the_index(engine: Engine) -> None:
    """A sink holding thousands of messages to other addresses in the
    candidate's window (an overload): the expiry's probe reads the
    candidate's address from the GIN index, not the window's messages."""
    others = 3000
    signal_id = _past_deadline(
        engine,
        deadline_ago=GRACE * due_db.UNLOOKED_GRACES + 5,
        looked_after_deadline=None,
        outcome="no_match",
    )
    with transaction(engine) as s:
        s.execute(
            text(
                "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients,"
                " size, raw, received_at)"
                " SELECT 'app@example.test', ARRAY[a], ARRAY[a], 1, 'x'::bytea,"
                "        s.expires_at - interval '2 seconds'"
                " FROM signals s, (SELECT format('bulk-%s-%s@example.test', CAST(:tag AS text), g)"
                "                    AS a FROM generate_series(1, CAST(:n AS int)) g) m"
                " WHERE s.id = :tag"
            ),
            {"tag": signal_id, "n": others},
        )
    with engine.connect() as c:
        c.execute(text("ANALYZE sink_messages"))
        c.commit()
    with transaction(engine) as s:
        due = due_db.signal_ids_past_deadline(s, 10_000, GRACE, ["sink"])
        (scanned,) = s.execute(
            text(
                "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables"
                " WHERE relname = 'sink_messages'"
            )
        ).one()
        s.rollback()
    assert signal_id in due
    assert scanned < others, f"read {scanned} stored messages in order"
