"""Providers slower than a check's lease, and slow providers that occupy
every worker process: real MailDev behind a real delaying TCP proxy."""

from __future__ import annotations

import smtplib
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.helpers import (
    create_signal,
    db_rows,
    db_scalar,
    insert_sink_message,
    mail,
    signal_view,
    wait_result,
)
from tests.servers import DelayingProxy, MaildevServer, RecordingProxy
from tests.stack import Stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.providers]


def send_to_maildev(server: MaildevServer, to: str, run_id: str) -> None:
    with smtplib.SMTP(server.host, server.smtp_port, timeout=10) as smtp:
        smtp.sendmail("app@example.test", [to], mail(to, run=run_id))


def test_a_provider_slower_than_the_check_lease_still_counts(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """Every MailDev answer takes 3 s through the proxy, the check lease is
    2 s: the check heartbeats its lease, keeps its fence, and its result is
    written (without the heartbeat another worker would take the signal and
    every result would be fenced out)."""
    with DelayingProxy(maildev.host, maildev.web_port) as slow:
        stack = stack_factory(
            {
                "SIGNALBOX_CHECK_LEASE_SECONDS": "2",
                "SIGNALBOX_COALESCE_WINDOW_SECONDS": "0",
            }
        )
        (stack.logs.parent / "providers.toml").write_text(
            f'[providers.slow]\ntype = "maildev"\nurl = "{slow.url}"\ntimeout = 30\n'
        )
        stack.start()
        signal = create_signal(stack, provider="slow", expires_in_seconds=120, max_checks=100)
        send_to_maildev(maildev, signal["recipient"], signal["run_id"])
        slow.server_delay = 3.0

        view = wait_result(stack, signal["signal_id"], wait=60)

        assert view["status"] == "found", view
        rows = db_rows(
            stack,
            "SELECT fence, count(*), max(extract(epoch FROM finished_at - started_at))"
            " FROM checks WHERE signal_id = %s GROUP BY fence",
            signal["signal_id"],
        )
        assert all(n == 1 for _, n, _ in rows)  # one row per fence
        assert max(float(seconds) for _, _, seconds in rows) > 2  # slower than the lease
        slow.server_delay = 0


@contextmanager
def two_slow_providers(
    stack_factory: Callable[..., Stack],
    maildev: MaildevServer,
    env: dict[str, str] | None = None,
    more_providers: str = "",
) -> Iterator[tuple[Stack, DelayingProxy, DelayingProxy]]:
    """A started stack (two worker processes) with two MailDev providers,
    `slow-a` and `slow-b`, behind delaying proxies (and `more_providers`,
    lines of the providers file)."""
    with (
        DelayingProxy(maildev.host, maildev.web_port) as slow_a,
        DelayingProxy(maildev.host, maildev.web_port) as slow_b,
    ):
        stack = stack_factory({"SIGNALBOX_COALESCE_WINDOW_SECONDS": "0", **(env or {})})
        (stack.logs.parent / "providers.toml").write_text(
            f'[providers.slow-a]\ntype = "maildev"\nurl = "{slow_a.url}"\ntimeout = 60\n'
            f'[providers.slow-b]\ntype = "maildev"\nurl = "{slow_b.url}"\ntimeout = 60\n'
            + more_providers
        )
        stack.start()
        try:
            yield stack, slow_a, slow_b
        finally:
            slow_a.server_delay = slow_b.server_delay = 0


HOLD_SECONDS = 25.0


def hold_every_worker_process(stack: Stack, slow_a: DelayingProxy, slow_b: DelayingProxy) -> None:
    """Make both worker processes wait HOLD_SECONDS on a slow provider call."""
    slow_a.server_delay = slow_b.server_delay = HOLD_SECONDS
    create_signal(stack, provider="slow-a", expires_in_seconds=120)
    create_signal(stack, provider="slow-b", expires_in_seconds=120)
    wait_until(
        lambda: slow_a.connections and slow_b.connections,
        20,
        what="both slow providers to be called",
    )


def slow_calls_in_flight(stack: Stack) -> int:
    return int(
        db_scalar(
            stack,
            "SELECT count(*) FROM signals WHERE provider LIKE 'slow-%%'"
            " AND check_lease_until > now()",
        )
    )


def found_while_held(stack: Stack, signal_id: str, wait: int, outcome: str = "") -> list[str]:
    """Wait for the signal's result; assert it is found while both slow calls
    are still in flight; return the reasons of its checks (with `outcome`,
    only those)."""
    view = wait_result(stack, signal_id, wait=wait)
    assert view["status"] == "found", view
    assert slow_calls_in_flight(stack) == 2  # no worker process was free
    rows = db_rows(
        stack,
        "SELECT reason FROM checks WHERE signal_id = %s AND (%s = '' OR outcome = %s)"
        " ORDER BY started_at",
        signal_id,
        outcome,
        outcome,
    )
    return [reason for (reason,) in rows]


def test_the_sweep_runs_while_slow_checks_hold_every_worker_process(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """Two slow providers keep both worker processes busy for 25 s; the
    sweep, run by beat itself, still lapses a claim lease meanwhile."""
    with two_slow_providers(stack_factory, maildev) as (stack, slow_a, slow_b):
        found = create_signal(stack)
        stack.send(mail(found["recipient"], run=found["run_id"]), [found["recipient"]])
        assert wait_result(stack, found["signal_id"])["status"] == "found"

        hold_every_worker_process(stack, slow_a, slow_b)
        with stack.client() as api:
            claim = api.post(
                f"/v1/signals/{found['signal_id']}/claim",
                json={"run_id": found["run_id"], "lease_seconds": 5},
            )
        assert claim.status_code == 200

        wait_until(
            lambda: signal_view(stack, found["signal_id"])["status"] == "found",
            18,
            what="the sweep to lapse the claim while both workers are busy",
        )
        # Both slow calls were still in flight when the lease lapsed.
        assert slow_calls_in_flight(stack) == 2


def test_sink_mail_is_found_on_push_while_slow_checks_hold_every_worker_process(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """The sink's look at a delivery is a database query made by the sink
    itself: it is not queued behind slow provider calls holding both worker
    processes (a soak lost sink mail that way: its check tasks waited behind
    slow IMAP calls until the deadline passed)."""
    with two_slow_providers(stack_factory, maildev) as (stack, slow_a, slow_b):
        hold_every_worker_process(stack, slow_a, slow_b)
        signal = create_signal(stack, expires_in_seconds=120)
        stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])

        reasons = found_while_held(stack, signal["signal_id"], wait=15, outcome="matched")

        assert reasons == ["push"], reasons


def test_a_sink_signals_scheduled_look_is_made_while_slow_checks_hold_every_worker_process(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """Mail the sink stored without a push (as if the push were lost) is
    found by the signal's next scheduled look, which beat makes itself while
    both worker processes wait on slow provider calls."""
    with two_slow_providers(stack_factory, maildev) as (stack, slow_a, slow_b):
        signal = create_signal(stack, expires_in_seconds=12, max_checks=20)
        wait_until(
            lambda: (
                db_scalar(
                    stack, "SELECT count(*) FROM checks WHERE signal_id = %s", signal["signal_id"]
                )
                > 0
            ),
            10,
            what="the first look",
        )
        hold_every_worker_process(stack, slow_a, slow_b)
        insert_sink_message(stack, signal["recipient"], mail(signal["recipient"]))

        reasons = found_while_held(stack, signal["signal_id"], wait=18, outcome="matched")

        assert len(reasons) == 1 and reasons[0] in {"scheduled", "sweep"}, reasons


def test_a_sink_signals_first_look_is_made_by_the_api_while_slow_checks_hold_every_worker(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """A sink signal created while both worker processes wait on slow calls,
    with other check tasks queued behind them: its first look is no task but
    made by the API that created it, at once, and finds the mail that was
    there before the signal (before, that look waited for the sweep)."""
    with two_slow_providers(stack_factory, maildev) as (stack, slow_a, slow_b):
        hold_every_worker_process(stack, slow_a, slow_b)
        recipient = f"early-{uuid.uuid4().hex[:8]}@example.test"
        insert_sink_message(stack, recipient, mail(recipient))
        signal = create_signal(
            stack,
            recipient=recipient,
            received_after=(datetime.now(UTC) - timedelta(minutes=1)).isoformat(),
            expires_in_seconds=120,
        )
        # Another check task waits behind the slow calls too: the queue is not empty.
        create_signal(stack, provider="slow-a", expires_in_seconds=120)

        reasons = found_while_held(stack, signal["signal_id"], wait=15, outcome="matched")

        assert reasons == ["first"], reasons


def test_a_slow_provider_never_holds_every_worker_process(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """One slow provider, two checks of it at once, two worker processes: the
    bulkhead lets it hold one; the other check is refused (`circuit_open`,
    `provider_busy`, no budget spent) and the free process finds another
    polled provider's mail while the slow call is still in flight. (A soak
    lost MailDev mail whose checks waited behind slow IMAP calls.)"""
    fast = f'[providers.fast]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    with two_slow_providers(stack_factory, maildev, more_providers=fast) as (stack, slow_a, _):
        slow_a.server_delay = HOLD_SECONDS
        held = create_signal(stack, provider="slow-a", expires_in_seconds=120)
        wait_until(lambda: slow_a.connections, 20, what="the slow provider to be called")
        refused = create_signal(stack, provider="slow-a", expires_in_seconds=120, max_checks=5)

        def busy() -> list[tuple[object, ...]]:
            return db_rows(
                stack,
                "SELECT outcome, error_code, counted FROM checks WHERE signal_id = %s",
                refused["signal_id"],
            )

        wait_until(busy, 15, what="the second check of the slow provider")
        assert busy()[0] == ("circuit_open", "provider_busy", False)

        signal = create_signal(stack, provider="fast", expires_in_seconds=120)
        send_to_maildev(maildev, signal["recipient"], signal["run_id"])
        view = wait_result(stack, signal["signal_id"], wait=15)

        assert view["status"] == "found", view
        still = db_scalar(
            stack,
            "SELECT check_lease_until > now() FROM signals WHERE id = %s",
            held["signal_id"],
        )
        assert still is True  # the slow call was still in flight


def test_a_slow_to_connect_maildev_finds_the_mail_among_other_recipients_mail(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """Every new connection to MailDev starts 3 s late (the provider's timeout
    is 5 s) and eight other recipients' mail sits in the signal's window with
    its own: the signal is found before its deadline, and its look downloads
    the source of its own mail only."""
    with RecordingProxy(maildev.host, maildev.web_port, connect_delay=3) as slow:
        stack = stack_factory({"SIGNALBOX_COALESCE_WINDOW_SECONDS": "0"})
        (stack.logs.parent / "providers.toml").write_text(
            f'[providers.slow-start]\ntype = "maildev"\nurl = "{slow.url}"\ntimeout = 5\n'
        )
        stack.start()
        recipient = f"user-{uuid.uuid4().hex[:8]}@example.test"
        for i in range(8):
            other = f"other{i}-{uuid.uuid4().hex[:8]}@example.test"
            send_to_maildev(maildev, other, f"run-other-{i}")
        send_to_maildev(maildev, recipient, "run-own")

        def nine_listed() -> list[dict[str, Any]] | None:
            listed: list[dict[str, Any]] = httpx.get(f"{maildev.url}/email", timeout=10).json()
            return listed if len(listed) >= 9 else None

        listed = wait_until(nine_listed, 10, what="MailDev to list the nine messages")
        own = [m["id"] for m in listed if m["envelope"]["to"][0]["address"] == recipient]
        signal = create_signal(
            stack,
            provider="slow-start",
            recipient=recipient,
            run_id="run-own",
            received_after=(datetime.now(UTC) - timedelta(minutes=1)).isoformat(),
            expires_in_seconds=30,
            max_checks=20,
        )

        view = wait_result(stack, signal["signal_id"], wait=40)

        assert view["status"] == "found", view
        sources = {p for p in slow.requests if p.endswith("/source")}
        assert sources == {f"/email/{own[0]}/source"}
