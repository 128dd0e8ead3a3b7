"""The SMTP sink over a real socket: accepted domains, size limit, malformed MIME."""

from __future__ import annotations

import re
import smtplib
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.integration.helpers import create_signal, mail, wait_result
from tests.stack import SHARED_DOMAIN, Stack, wait_until

pytestmark = pytest.mark.integration


def sink_count(stack: Stack) -> int:
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        return int(conn.execute("SELECT count(*) FROM sink_messages").fetchone()[0])


@pytest.fixture
def strict_stack(stack_factory: Callable[..., Stack]) -> Stack:
    stack = stack_factory(
        {
            "SIGNALBOX_SMTP_DOMAINS": "example.test,qa.example.test",
            "SIGNALBOX_SMTP_MAX_BYTES": "20000",
        }
    )
    return stack.start(worker=False, beat=False)


def test_recipient_outside_accepted_domains_gets_550(strict_stack: Stack) -> None:
    with smtplib.SMTP(strict_stack.smtp_host, strict_stack.smtp_port, timeout=60) as smtp:
        smtp.ehlo()
        smtp.mail("app@example.test")
        code, _ = smtp.rcpt("someone@elsewhere.test")
        ok_code, _ = smtp.rcpt("someone@QA.example.test")
    assert code == 550
    assert ok_code == 250
    assert sink_count(strict_stack) == 0


def test_oversize_message_gets_552_and_nothing_is_stored(strict_stack: Stack) -> None:
    big = mail("user@example.test", body="x" * 30000)
    with (
        pytest.raises(smtplib.SMTPRecipientsRefused) as err,
        smtplib.SMTP(strict_stack.smtp_host, strict_stack.smtp_port, timeout=60) as smtp,
    ):
        # smtplib declares its SIZE: the sink refuses the recipient (naming it
        # in the refusal it records), not the sender.
        smtp.sendmail("app@example.test", ["user@example.test"], big)
    ((code, text),) = err.value.recipients.values()
    assert code == 552 and b"message too large (" in text
    assert sink_count(strict_stack) == 0


def test_malformed_mime_is_stored_raw_and_matched_on_what_decodes(stack: Stack) -> None:
    recipient = f"broken-{uuid.uuid4().hex[:6]}@example.test"
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={
                "run_id": "run-broken",
                "test_case": "malformed",
                "recipient": recipient,
                "subject_contains": "welcome",
            },
        ).json()
    raw = (
        f"To: {recipient}\r\n"
        "Subject: =?utf-8?B?V2VsY29tZSDwn5GL?= \r\n"
        'Content-Type: multipart/alternative; boundary="never-closed"\r\n'
        "Content-Transfer-Encoding: base64\r\n\r\n"
        "--never-closed\r\nContent-Type: text/plain; charset=no-such-charset\r\n\r\n"
        "\xff\xfe broken =?= bytes\r\n"
    ).encode("latin-1")
    stack.send(raw, [recipient])
    view = wait_result(stack, signal["signal_id"])
    assert view["status"] == "found"
    assert view["message"]["subject"].startswith("Welcome")
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        stored = conn.execute("SELECT raw FROM sink_messages").fetchone()[0]
    assert bytes(stored) == raw


def test_mail_to_a_cc_recipient_matches_the_signal(stack: Stack) -> None:
    recipient = f"cc-{uuid.uuid4().hex[:6]}@example.test"
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={"run_id": "run-cc", "test_case": "cc", "recipient": recipient.upper()},
        ).json()
    # Delivered only to a shared address (public mail, §11.1): its Cc matches.
    main = f"main@{SHARED_DOMAIN}"
    raw = f"To: {main}\r\nCc: {recipient}\r\nSubject: hi\r\n\r\nhello\r\n"
    stack.send(raw, [main])
    assert wait_result(stack, signal["signal_id"])["status"] == "found"


def test_a_cc_naming_a_held_address_never_gives_mail_delivered_elsewhere_to_its_holder(
    stack: Stack,
) -> None:
    """Visibility follows the envelope where the sink knows it, never a Cc the
    sender wrote: mail delivered only to an address nobody holds is not the
    namespace's that holds the address its Cc names (§11.1)."""
    recipient = f"cc-{uuid.uuid4().hex[:6]}@example.test"
    signal = create_signal(stack, recipient=recipient, expires_in_seconds=3)
    raw = f"To: main@example.test\r\nCc: {recipient}\r\nSubject: hi\r\n\r\nhello\r\n"
    stack.send(raw, [f"main-{uuid.uuid4().hex[:6]}@example.test"])
    assert wait_result(stack, signal["signal_id"], wait=15)["status"] == "expired"


def test_the_101st_recipient_of_one_message_gets_452(stack: Stack) -> None:
    recipients = [f"r{i}-{uuid.uuid4().hex[:4]}@example.test" for i in range(101)]
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp:
        smtp.ehlo()
        smtp.mail("app@example.test")
        codes = [smtp.rcpt(r)[0] for r in recipients]
        smtp.rset()
    assert codes[:100] == [250] * 100
    assert codes[100] == 452
    assert sink_count(stack) == 0


def test_a_message_to_the_allowed_recipients_is_stored_after_a_452(stack: Stack) -> None:
    recipients = [f"ok{i}-{uuid.uuid4().hex[:4]}@example.test" for i in range(101)]
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp:
        refused = smtp.sendmail("app@example.test", recipients, mail(recipients[0]))
    assert list(refused) == [recipients[100]]
    assert refused[recipients[100]][0] == 452
    assert sink_count(stack) == 1


def test_connections_past_the_cap_get_421_and_a_freed_slot_is_reused(
    stack_factory: Callable[..., Stack],
) -> None:
    capped = stack_factory({"SIGNALBOX_SMTP_MAX_CONNECTIONS": "2"})
    capped.start_smtp()

    def welcome() -> smtplib.SMTP | None:
        try:
            return smtplib.SMTP(capped.smtp_host, capped.smtp_port, timeout=60)
        except smtplib.SMTPConnectError:
            return None  # a probe's session (the readiness check) may still count

    first = wait_until(welcome, 20, what="a first session")
    second = wait_until(welcome, 20, what="a second session")
    try:
        with pytest.raises(smtplib.SMTPConnectError) as refused:
            smtplib.SMTP(capped.smtp_host, capped.smtp_port, timeout=60)
        assert refused.value.smtp_code == 421
        assert first.noop()[0] == 250  # the open sessions are not disturbed
    finally:
        first.quit()
    try:
        third = wait_until(welcome, 20, what="a freed connection slot")
        third.quit()
    finally:
        second.quit()


def test_concurrent_sessions_each_get_the_id_of_their_own_stored_message(stack: Stack) -> None:
    """Messages of concurrent sessions are committed together (group commit):
    each 250 still names the row holding that very message, stored once."""
    recipient = f"burst-{uuid.uuid4().hex[:8]}@example.test"

    def session(n: int) -> list[tuple[str, int, bytes]]:
        sent = []
        with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
            smtp.ehlo()
            for i in range(8):
                token = f"token-{n}-{i}-{uuid.uuid4().hex}"
                assert smtp.mail("app@example.test")[0] == 250
                assert smtp.rcpt(recipient)[0] == 250
                code, reply = smtp.data(mail(recipient, subject=token))
                sent.append((token, code, reply))
        return sent

    with ThreadPoolExecutor(8) as pool:
        sent = [s for batch in pool.map(session, range(8)) for s in batch]
    assert {code for _, code, _ in sent} == {250}
    queued = {}
    for token, _, reply in sent:
        found = re.search(rb"queued as (\d+)", reply)
        assert found is not None, reply
        queued[int(found.group(1))] = token
    assert len(queued) == 64
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT id, raw, envelope_recipients FROM sink_messages"
            " WHERE %s = ANY(envelope_recipients)",
            (recipient,),
        ).fetchall()
    assert len(rows) == 64
    for sink_id, raw, envelope in rows:
        assert queued[sink_id].encode() in bytes(raw)
        assert envelope == [recipient]
