"""The soak harness, CI-sized: ~90 short-lived signals on the three providers under
one fault of each kind (network partitions and database faults included, each
a few seconds long); every invariant must hold (nothing lost, nothing taken
twice, checks and dead letters accounted for, nothing left waiting).

It runs the whole of bench/soak.py: its own PostgreSQL (restarted), Redis
(restarted), MailDev and Dovecot (stopped, slowed), API, sink, two workers
(killed), a dead-letter consumer and beat. The assertion message is the
invariant table with examples, the faults and the machine.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.soak import ALL_FAULTS, Options, run_soak
from bench.soak_invariants import check
from bench.soak_world import Tuning

pytestmark = [pytest.mark.integration, pytest.mark.providers]

CI_SOAK = Options(
    signals=90,
    duration=34.0,
    providers=["sink", "maildev", "imap"],
    # The quick faults first: a stopped MailDev takes a while to start again.
    faults=[
        "kill_worker",
        "restart_broker",
        "restart_postgres",
        "terminate_backends",
        "exhaust_connections",
        "idle_in_transaction",
        "partition_worker_db",
        "partition_sink_db",
        "partition_broker",
        "slow_provider",
        "stop_provider",
        "overload",  # last: it waits for the backlog of the faults before it to drain
    ],
    fault_count=len(ALL_FAULTS),
    shuffle_faults=False,
    seed=20261130,
    window_min=12,
    window_max=30,
    provider_outage=5.0,
    broker_outage=2.0,
    postgres_outage=2.0,
    slow_for=8.0,
    idle_for=5.0,
    idle_after=1.0,
    terminate_rounds=2,
    exhaust_for=3.0,
    partition=True,  # one worker, the sink and Redis in network namespaces (root, iproute2)
    partition_for=3.0,
    overload_for=4.0,
    overload_step=2.0,
    overload_steps=3,
    push_interval=2.0,
    busy_messages=520,  # the sink's busy address: more than one page of older mail
    busy_maildev=150,
    # Expiry waits for a signal's final look (up to the tuning's deadline
    # grace, 15 s): a slowed IMAP can hold it that long.
    grace=20.0,
    dlq_drain=10.0,
    threads=48,
    tuning=Tuning(check_lease=6.0, deadline_grace=15.0),
)


# Starting the world (PostgreSQL, Redis, MailDev, Dovecot, six Signalbox
# processes) takes 20 s on a quiet machine and over a minute on a busy one;
# the soak itself ~60 s. The test's own timeout is for the busy case.
@pytest.mark.timeout(600)
def test_soak_under_every_kind_of_fault_loses_nothing_and_keeps_every_invariant(
    tmp_path: Path,
) -> None:
    outcome = run_soak(CI_SOAK, root=tmp_path / "soak", log=print)

    assert set(outcome.faults) == set(ALL_FAULTS), outcome.render()
    assert outcome.report.violations == 0, "\n" + outcome.render()
    observed = {o["fault"]: o for o in outcome.record["observations"]}
    # Backends of the Signalbox processes were found by name and terminated.
    assert sum(observed["terminate_backends"]["terminated"].values()) > 0, outcome.render()
    # With every connection taken, readiness says so and no create got a 500.
    exhausted = observed["exhaust_connections"]
    assert exhausted["connections_taken"] > 0, outcome.render()
    assert 503 in exhausted["readyz"], outcome.render()
    assert all(
        code.split("+")[0] in ("201", "429") or code == "503+Retry-After"
        for code in exhausted["creates"]
    ), outcome.render()
    # Overloaded at 1.5 x the rate found first; the backlog drained.
    overload = observed["overload"]
    assert overload["sustained_per_second"] > 0 and overload["signals"] > 0, outcome.render()
    assert overload["time_to_drain"] is not None, outcome.render()
    # The consumers claimed and consumed what was found (one receipt per
    # message: an invariant of the table above).
    assert outcome.record["consumes"].get("consume 200", 0) > 0, outcome.render()
    # The held snapshot was seen as the oldest transaction.
    assert observed["idle_in_transaction"]["oldest_transaction_peak"] >= 3.0, outcome.render()
    # Every fault that ended while signals were still being created was
    # followed by a create the API answered.
    recovered = [r for r in outcome.record["recovery"] if r["ended"] < CI_SOAK.duration - 2]
    assert recovered, outcome.render()
    assert all(r["first_create"] is not None for r in recovered), outcome.render()


def _signal_row(conn: psycopg.Connection[Any], sid: str, **cols: Any) -> None:
    values = {
        "id": sid,
        "namespace": "alpha",
        "idempotency_key": f"run-1:{sid}",
        "run_id": "run-1",
        "test_case": sid,
        "recipient": f"{sid}@soak.test",
        "received_after": "2026-11-29T10:00:00Z",
        "expires_at": "2026-11-29T10:00:30Z",
        "max_checks": 20,
        "provider": "sink",
        **cols,
    }
    names = ", ".join(values)
    marks = ", ".join(f"%({k})s" for k in values)
    conn.execute(f"INSERT INTO signals ({names}) VALUES ({marks})", values)


def test_invariant_checker_counts_each_kind_of_violation(database_url: str) -> None:
    """The checker is not vacuous: rows that break each invariant are counted."""
    t0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC).timestamp()
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Lost: its mail came 10 s before the deadline, yet it expired.
        _signal_row(conn, "sig_lost", status="expired", expiry_reason="deadline")
        # Found with another run's message.
        conn.execute(
            "INSERT INTO messages (id, provider, provider_message_id, received_at, subject,"
            " recipients, run_marker) VALUES ('msg_1', 'sink', '1', '2026-11-29T10:00:05Z',"
            " 'Welcome #m000002', ARRAY['sig_wrong@soak.test'], 'run-2')"
        )
        _signal_row(conn, "sig_wrong", status="found", message_id="msg_1", checks_count=1)
        conn.execute(
            "INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,"
            " started_at, counted)"
            " VALUES ('sig_wrong', 1, 1, 'sink', 'first', 'matched', now(), true)"
        )
        # Found with mail whose delivery began before the deadline (10:00:30)
        # and was acknowledged 1.3 s after it: a provider back from an outage
        # stamps it while the delivery is in flight. Not a violation...
        # ...unlike mail whose delivery began 2 s after the deadline.
        for sid, mail_id in (("sig_slow_ack", "m000003"), ("sig_late", "m000004")):
            conn.execute(
                "INSERT INTO messages (id, provider, provider_message_id, received_at, subject,"
                " recipients) VALUES (%s, 'imap', %s, '2026-11-29T10:00:30Z', %s, %s)",
                (f"msg_{sid}", mail_id, f"Welcome #{mail_id}", [f"{sid}@soak.test"]),
            )
            _signal_row(
                conn,
                sid,
                provider="imap",
                status="found",
                message_id=f"msg_{sid}",
                checks_count=1,
            )
            conn.execute(
                "INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,"
                " started_at, counted) VALUES (%s, 1, 1, 'imap', 'first', 'matched', now(), true)",
                (sid,),
            )
        # A push check that spent the budget.
        _signal_row(
            conn, "sig_push", status="waiting", checks_count=1, expires_at="2099-01-01T00:00:00Z"
        )
        conn.execute(
            "INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,"
            " started_at, counted)"
            " VALUES ('sig_push', 1, 1, 'sink', 'push', 'no_match', now(), true)"
        )
        # A look that rode along with another signal's check when one check was
        # left spent nothing (its row says so): not a violation.
        _signal_row(
            conn, "sig_ride", status="waiting", checks_count=0, expires_at="2099-01-01T00:00:00Z"
        )
        conn.execute(
            "INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,"
            " started_at, counted)"
            " VALUES ('sig_ride', 1, 1, 'sink', 'scheduled', 'no_match', now(), false)"
        )
        # Still waiting long after its deadline.
        _signal_row(conn, "sig_stuck", status="waiting")
        # One message consumed by two signals of one namespace.
        for n, sid in enumerate(("sig_wrong", "sig_slow_ack")):
            conn.execute(
                "INSERT INTO receipts (id, signal_id, claim_id, namespace, run_id, message_id,"
                " claimed_at, evidence) VALUES (%s, %s, %s, 'alpha', 'run-1', 'msg_1', now(),"
                " '{}')",
                (f"rcpt_{n}", sid, f"clm_{n}"),
            )
        # A dead letter handled twice by the queue's consumer.
        conn.execute(
            "INSERT INTO dead_letters (id, signal_id, generation, namespace, run_id, provider,"
            " reason, checks_total, checks_by_outcome, near_misses, recommendation)"
            " VALUES ('dlq_1', 'sig_lost', 1, 'alpha', 'run-1', 'sink', 'deadline', 0, '{}',"
            " '[]', 'x')"
        )
        # Expired without any dead letter.
        _signal_row(conn, "sig_nodlq", status="expired", expiry_reason="deadline")

        def planned(sid: str, **extra: Any) -> dict[str, Any]:
            return {
                "key": sid,
                "signal_id": sid,
                "namespace": "alpha",
                "run_id": "run-1",
                "provider": "sink",
                "recipient": f"{sid}@soak.test",
                "subject_contains": None,
                "require_run_marker": False,
                "max_checks": 20,
                "fate": "mid",
                "group": "private",
                "created_wall": t0,
                **extra,
            }

        record = {
            "grace": 5.0,
            "clock_offset": 0.0,
            "breaker_open": 3.0,
            "signals": [
                planned("sig_lost"),
                planned("sig_wrong"),
                planned("sig_push"),
                planned("sig_ride"),
                planned("sig_stuck"),
                planned("sig_nodlq"),
                planned("sig_slow_ack", provider="imap"),
                planned("sig_late", provider="imap"),
                {"key": "never", "signal_id": None},
            ],
            "mails": [
                {
                    "mail_id": "m000001",
                    "kind": "match",
                    "signal_key": "sig_lost",
                    "recipient": "sig_lost@soak.test",
                    "subject": "Welcome #m000001",
                    "run_marker": None,
                    "acked": t0 + 20.0,
                    "planned": t0 + 20.0,
                },
                {
                    "mail_id": "m000002",
                    "kind": "other_run",
                    "signal_key": None,
                    "recipient": "sig_wrong@soak.test",
                    "subject": "Welcome #m000002",
                    "run_marker": "run-2",
                    "acked": t0 + 5.0,
                    "planned": t0 + 5.0,
                },
                {
                    "mail_id": "m000003",
                    "kind": "match",
                    "signal_key": "sig_slow_ack",
                    "recipient": "sig_slow_ack@soak.test",
                    "subject": "Welcome #m000003",
                    "run_marker": None,
                    "sent": t0 + 29.4,
                    "acked": t0 + 31.3,
                    "planned": t0 + 28.8,
                },
                {
                    "mail_id": "m000004",
                    "kind": "match",
                    "signal_key": "sig_late",
                    "recipient": "sig_late@soak.test",
                    "subject": "Welcome #m000004",
                    "run_marker": None,
                    "sent": t0 + 32.0,
                    "acked": t0 + 32.1,
                    "planned": t0 + 28.8,
                },
            ],
            "outages": [],
        }
        report = check(conn, record, {"dlq_1": 2})

    counts = {row.name.split(":")[0]: row.violations for row in report.rows}
    assert counts == {
        "lost": 1,
        "a message satisfies two signals of one namespace": 0,
        "a signal found with a message that does not match it": 2,
        "two check rows for one (signal, fence)": 0,
        "checks_count differs from its counted check rows": 1,
        "expired signal without exactly one dead letter per generation": 1,
        "dead letter not handled exactly once by the dead_letter queue consumer": 1,
        "signal still waiting more than 5 s after its deadline": 1,
        "signal the API never created (retried 60 s)": 1,
        "a message consumed more than once in a namespace, or a signal twice": 1,
    }, report.render()
    wrong = next(r for r in report.rows if r.name.startswith("a signal found with"))
    assert any("sig_late" in e and "sent 2.0 s after the deadline" in e for e in wrong.examples)
    assert not any("sig_slow_ack" in e for e in wrong.examples)
