"""`max_checks: 1` on a polled provider (docs/api.md, `max_checks`): the one
provider call is made at the deadline, not at the first look, and it finds a
mail sent before the deadline."""

from __future__ import annotations

import smtplib
import uuid
from collections.abc import Callable

import pytest

from tests.integration.helpers import create_signal, db_rows, mail, signal_view, wait_result
from tests.servers import LOOPBACK, MaildevServer
from tests.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.providers]


@pytest.mark.timeout(180)
def test_a_polled_provider_s_only_check_of_a_budget_of_one_is_at_the_deadline(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    stack = stack_factory()
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.md]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )
    stack.start()
    recipient = f"one-{uuid.uuid4().hex[:8]}@example.test"
    signal = create_signal(
        stack, recipient=recipient, provider="md", max_checks=1, expires_in_seconds=8
    )
    sid = signal["signal_id"]
    # Its first check is scheduled at the deadline: none before it.
    due = db_rows(stack, "SELECT next_check_at = expires_at FROM signals WHERE id = %s", sid)
    assert due == [(True,)]
    with smtplib.SMTP(LOOPBACK, maildev.smtp_port, timeout=30) as smtp:
        smtp.sendmail("app@example.test", [recipient], mail(recipient))
    assert signal_view(stack, sid)["status"] == "waiting"
    assert db_rows(stack, "SELECT 1 FROM checks WHERE signal_id = %s", sid) == []

    view = wait_result(stack, sid, wait=40)

    assert view["status"] == "found", view
    checks = db_rows(
        stack,
        "SELECT c.counted, c.started_at >= s.expires_at FROM checks c"
        " JOIN signals s ON s.id = c.signal_id WHERE c.signal_id = %s",
        sid,
    )
    assert checks == [(True, True)]
