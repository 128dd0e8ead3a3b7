"""Providers slower than a check's lease, and slow providers that occupy
every worker process: real MailDev behind a real delaying TCP proxy."""

from __future__ import annotations

import smtplib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_rows, mail, signal_view, wait_result
from tests.servers import DelayingProxy, MaildevServer, maildev_server
from tests.stack_fixtures import Stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.providers]


@pytest.fixture
def maildev(tmp_path: Path) -> Iterator[MaildevServer]:
    with maildev_server(tmp_path / "maildev") as server:
        yield server


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


def test_the_sweep_runs_while_slow_checks_hold_every_worker_process(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """Two slow providers keep both worker processes busy for 25 s; the
    sweep, run by beat itself, still lapses a claim lease meanwhile."""
    with (
        DelayingProxy(maildev.host, maildev.web_port) as slow_a,
        DelayingProxy(maildev.host, maildev.web_port) as slow_b,
    ):
        stack = stack_factory({"SIGNALBOX_COALESCE_WINDOW_SECONDS": "0"})
        (stack.logs.parent / "providers.toml").write_text(
            f'[providers.slow-a]\ntype = "maildev"\nurl = "{slow_a.url}"\ntimeout = 60\n'
            f'[providers.slow-b]\ntype = "maildev"\nurl = "{slow_b.url}"\ntimeout = 60\n'
        )
        stack.start()
        found = create_signal(stack)
        stack.send(mail(found["recipient"], run=found["run_id"]), [found["recipient"]])
        assert wait_result(stack, found["signal_id"])["status"] == "found"

        slow_a.server_delay = slow_b.server_delay = 25.0
        create_signal(stack, provider="slow-a", expires_in_seconds=120)
        create_signal(stack, provider="slow-b", expires_in_seconds=120)
        wait_until(
            lambda: slow_a.connections and slow_b.connections,
            20,
            what="both slow providers to be called",
        )
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
        busy = db_rows(
            stack,
            "SELECT count(*) FROM signals WHERE provider LIKE 'slow-%%'"
            " AND check_lease_until > now()",
        )
        assert busy == [(2,)]
        slow_a.server_delay = slow_b.server_delay = 0
