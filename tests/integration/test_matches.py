"""GET /v1/signals/{id}/matches reads the window when asked: for the sink,
from its store, so messages that arrived after the signal was found are
listed though no look recorded them; oldest first, with `taken_by`. For a
polled provider, what its looks recorded, and the answer says so."""

from __future__ import annotations

import smtplib
import time
from collections.abc import Callable
from email.message import EmailMessage
from typing import Any

import pytest

from tests.integration.helpers import create_signal, db_rows, db_scalar, mail, wait_result
from tests.servers import MaildevServer
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


def matches_of(stack: Stack, signal_id: str, token: str | None = None) -> Any:
    with stack.client(token) as api:
        return api.get(f"/v1/signals/{signal_id}/matches")


def test_three_mails_a_fifth_of_a_second_apart_are_all_listed_after_the_first_was_found(
    stack: Stack,
) -> None:
    signal = create_signal(stack, subject_contains="Verify", expires_in_seconds=60)
    recipient = signal["recipient"]
    for n in range(3):
        stack.send(mail(recipient, f"Verify your account ({n})"), [recipient])
        time.sleep(0.2)
    stack.send(mail(recipient, "Welcome"), [recipient])  # not a match
    found = wait_result(stack, signal["signal_id"], wait=30)
    assert found["status"] == "found", found
    time.sleep(0.5)  # any look the deliveries pushed is over: the signal is found

    response = matches_of(stack, signal["signal_id"])

    assert response.status_code == 200, response.text
    body = response.json()
    assert body["source"] == "store"
    items = body["items"]
    assert [i["subject"] for i in items] == [f"Verify your account ({n})" for n in range(3)]
    assert [i["taken_by"] for i in items] == [signal["signal_id"], None, None]
    assert items[0]["message_id"] == found["message"]["message_id"]
    assert [i["received_at"] for i in items] == sorted(i["received_at"] for i in items)
    # Asking again lists the same messages under the same ids (recorded once).
    assert matches_of(stack, signal["signal_id"]).json()["items"] == items
    assert (
        db_scalar(
            stack,
            "SELECT count(*) FROM messages WHERE %s = ANY(recipients)",
            recipient.lower(),
        )
        == 4
    )
    assert matches_of(stack, signal["signal_id"], TOKENS["other"]).status_code == 404


def test_without_a_body_filter_a_purged_message_is_listed_from_its_summary(stack: Stack) -> None:
    """No body filter: the summaries decide, the bytes are never needed."""
    signal = create_signal(stack, expires_in_seconds=60)
    recipient = signal["recipient"]
    stack.send(mail(recipient, "First"), [recipient])
    found = wait_result(stack, signal["signal_id"], wait=30)
    assert found["status"] == "found", found
    stack.send(mail(recipient, "Second"), [recipient])
    assert [i["subject"] for i in matches_of(stack, signal["signal_id"]).json()["items"]] == [
        "First",
        "Second",
    ]
    db_rows(stack, "UPDATE messages SET raw = NULL WHERE %s = ANY(recipients)", recipient.lower())

    items = matches_of(stack, signal["signal_id"]).json()["items"]

    assert [i["subject"] for i in items] == ["First", "Second"]


def test_a_body_filter_reads_each_later_message_and_skips_the_purged(stack: Stack) -> None:
    signal = create_signal(stack, body_contains="code is 493817", expires_in_seconds=60)
    recipient = signal["recipient"]
    stack.send(mail(recipient, "One", body="Your code is 493817"), [recipient])
    found = wait_result(stack, signal["signal_id"], wait=30)
    assert found["status"] == "found", found
    stack.send(mail(recipient, "Other", body="Your code is 111111"), [recipient])
    stack.send(mail(recipient, "Two", body="Again: your code is 493817"), [recipient])
    big = "Your code is 493817\n" + "x" * (3 * 1024 * 1024)
    stack.send(mail(recipient, "Big", body=big), [recipient])

    items = matches_of(stack, signal["signal_id"]).json()["items"]

    assert [(i["subject"], i["taken_by"]) for i in items] == [
        ("One", signal["signal_id"]),
        ("Two", None),
        ("Big", None),
    ]
    db_rows(stack, "UPDATE messages SET raw = NULL WHERE subject = 'Two'")
    again = matches_of(stack, signal["signal_id"]).json()["items"]
    assert [i["subject"] for i in again] == ["One", "Big"]


def test_a_polled_provider_lists_what_its_looks_recorded_and_says_so(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """MailDev is not asked again: mail that came after the last look is not
    listed, and the answer's `source` says the window is the looks'."""
    stack = stack_factory()
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )
    stack.start()
    signal = create_signal(stack, provider="catcher", subject_contains="Verify")
    recipient = signal["recipient"]

    def send(subject: str) -> None:
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = "app@example.test", recipient, subject
        msg.set_content("Your code is 493817")
        with smtplib.SMTP(maildev.host, maildev.smtp_port, timeout=10) as smtp:
            smtp.send_message(msg)

    send("Verify your account")
    found = wait_result(stack, signal["signal_id"], wait=40)
    assert found["status"] == "found", found
    send("Verify again")
    time.sleep(1.5)

    body = matches_of(stack, signal["signal_id"]).json()

    assert body["source"] == "looks"
    assert [(i["subject"], i["taken_by"]) for i in body["items"]] == [
        ("Verify your account", signal["signal_id"])
    ]
