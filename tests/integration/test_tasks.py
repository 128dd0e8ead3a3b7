"""The Celery tasks of workers/tasks.py on a worker thread in this process
(celery.contrib.pytest's `celery_worker`), on the real broker (the test
Redis) and the real test database.

The worker consumes a queue of its own, so it runs exactly the tasks a test
sends it: what the tasks dispatch in turn (first looks, dead letters) waits
on the real queues, consumed by no one. Tests where processes matter (kills,
restarts, prefork children) run real `celery worker` processes instead
(test_faults.py, test_metrics.py, test_dead_letters.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from celery import Celery

from app.db.engine import get_engine, transaction
from app.domain.states import Status
from app.infra import queue
from app.settings import get_settings
from app.usecases import signals
from app.usecases.expiry import expire_signal
from app.usecases.inputs import SignalCreate
from tests.integration.helpers import mail

# Imported before any test app exists: its shared tasks then join every test
# app (celery.contrib.pytest forgets the ones registered during a test).
import workers.tasks  # noqa: F401  isort: skip

pytestmark = pytest.mark.integration

UNDER_TEST = "tasks-under-test"
RESULT_TIMEOUT = 30


@pytest.fixture
def celery_config(service_env: dict[str, str]) -> Iterator[Mapping[str, Any]]:
    """The app's broker and message settings (app.infra.queue), with results
    kept in memory so that a test reads what a task returned. Once the worker
    has stopped, this process's pooled connections are closed (the shared
    reset only drops them)."""
    base = queue.make_celery(get_settings())
    try:
        kept = (
            "task_acks_late",
            "task_reject_on_worker_lost",
            "worker_prefetch_multiplier",
            "task_serializer",
            "accept_content",
            "broker_connection_retry_on_startup",
            "broker_transport_options",
        )
        config = {key: base.conf[key] for key in kept}
    finally:
        base.close()
    yield {
        **config,
        "broker_url": service_env["SIGNALBOX_BROKER_URL"],
        "task_default_queue": UNDER_TEST,
    }
    get_engine().dispose()


@pytest.fixture(scope="session")
def celery_includes() -> list[str]:
    return ["workers.tasks"]


@pytest.fixture(scope="session")
def celery_worker_parameters() -> Mapping[str, Any]:
    return {"queues": [UNDER_TEST]}


def run(app: Celery, name: str, *args: str) -> Any:
    """Send task `name` to the worker of this test and return its result."""
    return app.tasks[name].apply_async(args=args, queue=UNDER_TEST).get(timeout=RESULT_TIMEOUT)


def new_signal(**fields: Any) -> str:
    req = SignalCreate(
        run_id=f"run-{uuid.uuid4().hex[:6]}",
        test_case=f"case-{uuid.uuid4().hex[:6]}",
        recipient=f"u-{uuid.uuid4().hex[:6]}@example.test",
        **fields,
    )
    created = signals.signal_create(get_settings(), "default", req, None)
    return str(created.view["signal_id"])


def sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(str(get_settings().database_url), autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def test_check_of_a_due_sink_signal_finds_its_stored_mail(
    celery_app: Celery, celery_worker: object
) -> None:
    signal_id = new_signal()
    (recipient,) = sql("SELECT recipient FROM signals WHERE id = %s", signal_id)[0]
    raw = mail(recipient)
    # Stored without the push an SMTP delivery makes: only a check can see it.
    ((sink_id,),) = sql(
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw)"
        " VALUES ('app@example.test', %s, %s, %s, %s) RETURNING id",
        [recipient],
        [recipient],
        len(raw),
        raw,
    )

    report = run(celery_app, queue.CHECK_TASK, signal_id)

    # The report's `outcome` is the provider call's (it answered), and the
    # batch is the one signal; what the check decided is in the database.
    assert report["signals"] == 1 and report["outcome"] == "no_match"
    assert sql(
        "SELECT s.status, m.provider_message_id FROM signals s JOIN messages m"
        " ON m.id = s.message_id WHERE s.id = %s",
        signal_id,
    ) == [("found", str(sink_id))]
    assert sql("SELECT outcome FROM checks WHERE signal_id = %s", signal_id) == [("matched",)]


def test_dead_letter_alerts_once_when_delivered_twice(
    celery_app: Celery, celery_worker: object, caplog: pytest.LogCaptureFixture
) -> None:
    signal_id = new_signal()
    with transaction() as session:
        dead_letter_id = expire_signal(
            session, signal_id, expected=Status.WAITING, reason="deadline"
        )
    assert dead_letter_id

    with caplog.at_level(logging.WARNING, logger="signalbox.tasks"):
        first = run(celery_app, queue.DEAD_LETTER_TASK, dead_letter_id)
        second = run(celery_app, queue.DEAD_LETTER_TASK, dead_letter_id)

    assert first == {
        "dead_letter_id": dead_letter_id,
        "found": True,
        "alerted": True,
        "reason": "deadline",
    }
    assert second == {"dead_letter_id": dead_letter_id, "found": True, "alerted": False}
    alerts = [r for r in caplog.records if getattr(r, "event", None) == "dead_letter_alert"]
    assert [getattr(r, "dead_letter_id", None) for r in alerts] == [dead_letter_id]


def test_dead_letter_of_an_unknown_id_reports_it_not_found(
    celery_app: Celery, celery_worker: object
) -> None:
    report = run(celery_app, queue.DEAD_LETTER_TASK, "dlq_unknown")

    assert report == {"dead_letter_id": "dlq_unknown", "found": False, "alerted": False}


def test_sweep_expires_a_signal_looked_at_after_its_deadline_and_reports_it(
    celery_app: Celery, celery_worker: object
) -> None:
    signal_id = new_signal()
    # Its deadline passed a minute ago, and a look that began after it found nothing.
    sql(
        "UPDATE signals SET expires_at = now() - interval '60 seconds',"
        " last_look_at = now() - interval '59 seconds', last_outcome = 'no_match'"
        " WHERE id = %s",
        signal_id,
    )

    report = run(celery_app, queue.SWEEP_TASK)

    assert set(report) == {"expired", "lapsed", "enqueued", "republished"}
    assert report["expired"] == 1
    assert sql("SELECT status FROM signals WHERE id = %s", signal_id) == [("expired",)]


def test_retention_deletes_aged_sink_mail_and_reports_every_kind(
    celery_app: Celery, celery_worker: object
) -> None:
    raw = mail("old@example.test")
    sql(
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw,"
        " received_at) VALUES ('app@example.test', %s, %s, %s, %s, now() - interval '1000 days')",
        ["old@example.test"],
        ["old@example.test"],
        len(raw),
        raw,
    )

    report = run(celery_app, queue.RETENTION_TASK)

    assert set(report) == {
        "mailboxes",
        "address_holds",
        "receipts",
        "dead_letters",
        "signals",
        "found_signals",
        "checks",
        "message_bodies",
        "messages",
        "sink_messages",
        "smtp_refusals",
    }
    assert report["sink_messages"] == 1
    assert sql("SELECT count(*) FROM sink_messages") == [(0,)]
