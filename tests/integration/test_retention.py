"""Retention on a real stack: the `signalbox.retention` task, run by a real
worker, deletes aged content and then aged evidence, never a waiting signal's data."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from tests.integration.helpers import db_rows, mail
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def count(stack: Stack, query: str, *params: object) -> int:
    return int(db_rows(stack, query, *params)[0][0])


def age_everything(stack: Stack, hours: float) -> None:
    """Move every timestamp retention looks at `hours` into the past."""
    for table, column in (
        ("sink_messages", "received_at"),
        ("messages", "observed_at"),
        ("checks", "finished_at"),
        ("signals", "updated_at"),
        ("receipts", "consumed_at"),
        ("dead_letters", "created_at"),
    ):
        db_rows(stack, f"UPDATE {table} SET {column} = now() - make_interval(hours => %s)", hours)


def run_retention(stack: Stack) -> None:
    """Send the beat's task to the real worker and wait for it to finish."""
    from app.infra.queue import RETENTION_TASK, make_celery
    from app.settings import Settings

    task_id = f"retention-{uuid.uuid4().hex}"
    # On this stack's own broker: a Celery app this process built earlier may
    # point at another test's.
    app = make_celery(Settings(broker_url=stack.env["SIGNALBOX_BROKER_URL"]))
    try:
        # Task results are ignored by the app: the worker's log line says it finished.
        app.send_task(RETENTION_TASK, task_id=task_id)
    finally:
        app.close()
    # Generous: on a loaded machine the shared worker may still be busy with
    # the previous tests' checks before it takes this task.
    wait_until(
        lambda: f"signalbox.retention[{task_id}] succeeded" in stack.log_text("worker"),
        120,
        what="the retention task to finish on the worker",
    )


def test_retention_deletes_aged_content_then_evidence_but_never_a_waiting_signals_data(
    stack: Stack,
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    done_to = f"done-{uuid.uuid4().hex[:6]}@example.test"
    wait_to = f"wait-{uuid.uuid4().hex[:6]}@example.test"
    with stack.client() as api:
        done = api.post(
            "/v1/signals", json={"run_id": run_id, "test_case": "done", "recipient": done_to}
        ).json()
        waiting = api.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "waiting",
                "recipient": wait_to,
                "subject_contains": "welcome",
                "expires_in_seconds": 600,
            },
        ).json()
        doomed = api.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "doomed",
                "recipient": f"x-{done_to}",
                "expires_in_seconds": 1,
            },
        ).json()
        stack.send(mail(done_to, "Verify", run_id), [done_to])
        stack.send(mail(wait_to, "Not the one", run_id), [wait_to])  # a near miss of `waiting`
        stack.send(mail("nobody@example.test", "Spam", run_id), ["nobody@example.test"])
        assert (
            api.get(f"/v1/signals/{done['signal_id']}", params={"wait": 20}).json()["status"]
            == "found"
        )
        claim = api.post(f"/v1/signals/{done['signal_id']}/claim", json={"run_id": run_id}).json()
        assert api.post(f"/v1/claims/{claim['claim_id']}/consume").status_code == 200
        expired = api.get(f"/v1/signals/{doomed['signal_id']}", params={"wait": 20}).json()
        assert expired["status"] == "expired"
        discarded = api.post(
            f"/v1/dead-letters/{expired['dead_letter']['dead_letter_id']}/discard",
            json={"note": "test"},
        )
        assert discarded.status_code == 200, discarded.text
    wait_until(
        lambda: count(
            stack, "SELECT count(*) FROM near_misses WHERE signal_id = %s", waiting["signal_id"]
        ),
        20,
        what="the near miss of the waiting signal",
    )
    waiting_checks = count(
        stack, "SELECT count(*) FROM checks WHERE signal_id = %s", waiting["signal_id"]
    )
    done_message = db_rows(
        stack, "SELECT message_id FROM signals WHERE id = %s", done["signal_id"]
    )[0][0]

    with stack.client() as api:
        before = api.get(f"/v1/runs/{run_id}/evidence").json()

    # Past SIGNALBOX_RETENTION_HOURS (72), within the evidence horizon (90 days).
    age_everything(stack, 100)
    run_retention(stack)

    # The finished signals' check rows are gone, but the evidence keeps their counts.
    with stack.client() as api:
        after = api.get(f"/v1/runs/{run_id}/evidence").json()
    for ended in (done["signal_id"], doomed["signal_id"]):
        counted = [
            (s["checks"]["total"], s["checks"]["by_outcome"])
            for doc in (before, after)
            for s in doc["signals"]
            if s["signal_id"] == ended
        ]
        assert counted[0] == counted[1] and counted[0][0] >= 1

    assert (
        count(stack, "SELECT count(*) FROM sink_messages WHERE %s = ANY(all_recipients)", wait_to)
        == 1
    )
    assert (
        count(
            stack, "SELECT count(*) FROM sink_messages WHERE NOT %s = ANY(all_recipients)", wait_to
        )
        == 0
    )
    assert (
        count(stack, "SELECT count(*) FROM checks WHERE signal_id <> %s", waiting["signal_id"]) == 0
    )
    assert (
        count(stack, "SELECT count(*) FROM checks WHERE signal_id = %s", waiting["signal_id"])
        >= waiting_checks
    )
    assert (
        count(stack, "SELECT count(*) FROM near_misses WHERE signal_id = %s", waiting["signal_id"])
        == 1
    )
    # The consumed signal's message stays as evidence, without its body.
    assert db_rows(stack, "SELECT raw IS NULL FROM messages WHERE id = %s", done_message) == [
        (True,)
    ]
    assert count(stack, "SELECT count(*) FROM receipts") == 1
    assert count(stack, "SELECT count(*) FROM dead_letters") == 1
    assert count(stack, "SELECT count(*) FROM signals") == 3

    # Past the evidence horizon: receipts, resolved dead letters, terminal signals go.
    age_everything(stack, 24 * 91)
    run_retention(stack)

    assert count(stack, "SELECT count(*) FROM receipts") == 0
    assert count(stack, "SELECT count(*) FROM dead_letters") == 0
    assert db_rows(stack, "SELECT id, status FROM signals") == [(waiting["signal_id"], "waiting")]
    assert count(stack, "SELECT count(*) FROM messages WHERE id = %s", done_message) == 0
    # The waiting signal keeps its mail, its near miss and its checks, however old.
    assert (
        count(stack, "SELECT count(*) FROM sink_messages WHERE %s = ANY(all_recipients)", wait_to)
        == 1
    )
    assert (
        count(stack, "SELECT count(*) FROM near_misses WHERE signal_id = %s", waiting["signal_id"])
        == 1
    )
    assert (
        count(stack, "SELECT count(*) FROM checks WHERE signal_id = %s", waiting["signal_id"])
        >= waiting_checks
    )


def test_a_found_signal_nobody_claims_ends_with_its_content_at_the_retention_horizon(
    stack: Stack,
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    stale_to = f"stale-{uuid.uuid4().hex[:6]}@example.test"
    fresh_to = f"fresh-{uuid.uuid4().hex[:6]}@example.test"
    with stack.client() as api:
        stale = api.post(
            "/v1/signals", json={"run_id": run_id, "test_case": "stale", "recipient": stale_to}
        ).json()
        fresh = api.post(
            "/v1/signals", json={"run_id": run_id, "test_case": "fresh", "recipient": fresh_to}
        ).json()
        stack.send(mail(stale_to, "Verify", run_id), [stale_to])
        stack.send(mail(fresh_to, "Verify", run_id), [fresh_to])
        for signal in (stale, fresh):
            view = api.get(f"/v1/signals/{signal['signal_id']}", params={"wait": 20}).json()
            assert view["status"] == "found"
    stale_message = db_rows(
        stack, "SELECT message_id FROM signals WHERE id = %s", stale["signal_id"]
    )[0][0]
    # Only the stale one is past SIGNALBOX_RETENTION_HOURS (72).
    db_rows(
        stack,
        "UPDATE signals SET updated_at = now() - interval '100 hours' WHERE id = %s",
        stale["signal_id"],
    )
    db_rows(
        stack,
        "UPDATE messages SET observed_at = now() - interval '100 hours' WHERE id = %s",
        stale_message,
    )
    db_rows(
        stack,
        "UPDATE sink_messages SET received_at = now() - interval '100 hours'"
        " WHERE %s = ANY(all_recipients)",
        stale_to,
    )

    run_retention(stack)

    assert db_rows(stack, "SELECT id, status FROM signals ORDER BY created_at") == [
        (fresh["signal_id"], "found")
    ]
    assert count(stack, "SELECT count(*) FROM messages WHERE id = %s", stale_message) == 0
    assert (
        count(stack, "SELECT count(*) FROM sink_messages WHERE %s = ANY(all_recipients)", stale_to)
        == 0
    )
    with stack.client() as api:
        assert api.get(f"/v1/signals/{stale['signal_id']}").status_code == 404


def test_holds_are_deleted_once_their_mail_and_signals_are_past_every_horizon(
    stack: Stack,
) -> None:
    """A released hold, and an open one whose namespace has no signal left on
    the address, go at the evidence horizon; a hold with a signal stays."""
    live = f"live-{uuid.uuid4().hex[:6]}@example.test"
    with stack.client() as api:
        created = api.post(
            "/v1/signals", json={"run_id": "run-holds", "test_case": "t", "recipient": live}
        )
    assert created.status_code == 201, created.text
    db_rows(
        stack,
        "INSERT INTO address_holds (address, namespace, held_from, released_at) VALUES"
        " ('gone@example.test', 'default', now() - interval '100 days',"
        "  now() - interval '99 days'),"
        " ('orphan@example.test', 'default', now() - interval '100 days', NULL),"
        " ('recent@example.test', 'default', now() - interval '1 day', NULL)",
    )
    db_rows(
        stack,
        "UPDATE address_holds SET held_from = now() - interval '100 days' WHERE address = %s",
        live,
    )
    run_retention(stack)
    left = {r[0] for r in db_rows(stack, "SELECT address FROM address_holds")}
    assert left == {live, "recent@example.test"}


def _subplans_reading_signals(plan: dict[str, Any], name: str | None = None) -> list[str | None]:
    """For every node of `plan` (EXPLAIN's JSON) that reads the signals
    table: the subplan it runs in (None: the statement's own plan)."""
    name = plan.get("Subplan Name", name)
    found = [name] if plan.get("Relation Name") == "signals" else []
    for child in plan.get("Plans", []):
        found += _subplans_reading_signals(child, name)
    return found


def test_old_mail_is_deleted_past_many_waiting_signals_reading_them_once(
    in_process: None,
) -> None:
    """Retention keeps the old mail of waiting signals' recipients (however
    the address is cased in the signal) and deletes the rest, reading the
    waiting recipients once per batch: it compared every old row with every
    waiting signal (20 s a batch at 20,000 waiting and 2,000 old sink
    messages, past the statement timeout at 100,000, so nothing old was ever
    deleted)."""
    from sqlalchemy import text

    from app.db import retention as retention_db
    from app.db.engine import transaction

    waiting, old = 3000, 200
    with transaction() as session:
        session.execute(
            text(
                "INSERT INTO signals (id, namespace, idempotency_key, run_id, test_case,"
                " recipient, received_after, expires_at, max_checks, provider, next_check_at)"
                " SELECT 'sig_r' || g, 'default', 'k' || g, 'run', 'case',"
                "        'Waiting-' || g || '@Example.test', now(), now() + interval '1 day', 10,"
                "        'sink', now() + interval '1 hour'"
                "   FROM generate_series(1, :n) g"
            ),
            {"n": waiting},
        )
        # Old mail: every tenth to a waiting signal's recipient (lower-cased, as stored).
        addresses = (
            "CASE WHEN g % 10 = 0 THEN 'waiting-' || g || '@example.test'"
            " ELSE 'gone-' || g || '@example.test' END"
        )
        session.execute(
            text(
                "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients,"
                " size, raw, received_at)"
                f" SELECT 'app@example.test', ARRAY[{addresses}], ARRAY[{addresses}], 1,"
                "        'x'::bytea, now() - interval '100 hours'"
                "   FROM generate_series(1, :n) g"
            ),
            {"n": old},
        )
        session.execute(
            text(
                "INSERT INTO messages (id, provider, provider_message_id, received_at,"
                " observed_at, recipients)"
                f" SELECT 'msg_r' || g, 'sink', 'r' || g, now() - interval '100 hours',"
                f"        now() - interval '100 hours', ARRAY[{addresses}]"
                "   FROM generate_series(1, :n) g"
            ),
            {"n": old},
        )
        session.execute(text("ANALYZE signals"))
    with transaction() as session:
        # Too little memory for the waiting recipients' hash: the deletes make room.
        session.execute(text("SET LOCAL work_mem = '64kB'"))
        sink = retention_db.sink_message_delete_old(session, older_than_hours=72, limit=1000)
        messages = retention_db.message_delete_old(session, older_than_hours=72, limit=1000)
        # The plans they ran under the memory they left.
        for stmt in (retention_db._SINK_MESSAGES_OLD, retention_db._MESSAGES_OLD):
            ((plan,),) = session.execute(
                text("EXPLAIN (FORMAT JSON) " + stmt.sql), {"secs": 72 * 3600, "limit": 1000}
            ).all()
            shown = json.dumps(plan)
            # PostgreSQL shows a subplan run once and hashed as `hashed SubPlan n`.
            hashed = [
                name
                for name in _subplans_reading_signals(plan[0]["Plan"])
                if name is not None and re.search(rf"hashed {name}\b", shown)
            ]
            # (The plan's other reads of signals are keyed lookups, or run once:
            # the in-play messages' signals.)
            assert hashed, "the waiting recipients are not hashed once per statement"
    assert (sink, messages) == (old - old // 10, old - old // 10)
    with transaction() as session:
        kept = session.execute(
            text(
                "SELECT (SELECT count(*) FROM sink_messages"
                "         WHERE all_recipients[1] LIKE 'waiting-%'),"
                "       (SELECT count(*) FROM messages WHERE recipients[1] LIKE 'waiting-%'),"
                "       (SELECT count(*) FROM sink_messages WHERE all_recipients[1] LIKE 'gone-%')"
            )
        ).one()
    assert tuple(kept) == (old // 10, old // 10, 0)
