"""The inbox (`/v1/messages`) with two namespaces and an operator: every
sink message has its `msg_` id from its store and is listed for the
namespace it belongs to only; search, keyset pages, one message and its
bytes, delete (content purged, summary kept)."""

from __future__ import annotations

import re
import smtplib
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from typing import Any

import httpx
import pytest

from tests.integration.rich_mail import PDF_NAME, rich_mail
from tests.security.conftest import OPS_TOKEN, TOKEN_A, TOKEN_B
from tests.stack import Stack

pytestmark = pytest.mark.integration


def api(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def send(stack: Stack, raw: bytes, to: list[str]) -> str:
    """Send; the `msg_` id the sink's 250 names."""
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp:
        smtp.ehlo()
        smtp.mail("app@example.test")
        for rcpt in to:
            assert smtp.rcpt(rcpt)[0] == 250
        code, reply = smtp.data(raw)
    assert code == 250, reply
    found = re.search(rb"(msg_[0-9a-f]+)", reply)
    assert found is not None, reply
    return found.group(1).decode()


def plain(to: str, subject: str, body: str = "hello there") -> bytes:
    msg = EmailMessage()
    msg["From"] = "App <app@brand.test>"
    msg["To"] = to
    msg["Subject"] = subject
    msg["Message-ID"] = f"<{uuid.uuid4().hex}@brand.test>"
    msg.set_content(body)
    return msg.as_bytes()


def listed(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/v1/messages", params=params)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def wait_listed(client: httpx.Client, message_id: str, **params: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for item in listed(client, **params):
            if item["message_id"] == message_id:
                return item
        time.sleep(0.2)
    raise AssertionError(f"{message_id} never listed")


def test_a_message_nobody_watched_is_listed_with_its_store_id_for_its_namespace_only(
    tenancy_stack: Stack,
) -> None:
    to = f"inbox-{uuid.uuid4().hex[:6]}@team-a.test"
    subject = f"Reset code 493817 for {to}"
    mid = send(tenancy_stack, plain(to, subject), [to])
    with api(tenancy_stack, TOKEN_A) as a, api(tenancy_stack, TOKEN_B) as b:
        item = wait_listed(a, mid, recipient=to)
        assert item["subject"] == subject and item["to"] == [to]
        assert item["from"] == "app@brand.test" and item["taken_by"] is None
        assert item["purged"] is False and item["attachments"] == 0
        assert item["provider"] == "sink"
        assert mid not in {i["message_id"] for i in listed(b, recipient=to)}
        assert b.get(f"/v1/messages/{mid}").status_code == 404
        assert b.get(f"/v1/messages/{mid}/raw").status_code == 404
        assert b.delete(f"/v1/messages/{mid}").status_code == 404
        whole = a.get(f"/v1/messages/{mid}").json()
        assert whole["message_id"] == mid and whole["subject"] == subject
        assert a.get(f"/v1/messages/{mid}/raw").content == plain_bytes_of(a, mid)
    with api(tenancy_stack, OPS_TOKEN) as ops:
        seen = {i["message_id"]: i for i in listed(ops, limit=500)}
        assert mid in seen and "493817" not in seen[mid]["subject"]
        assert to not in seen[mid]["subject"]
        assert ops.get(f"/v1/messages/{mid}").status_code == 403


def plain_bytes_of(client: httpx.Client, message_id: str) -> bytes:
    answer = client.get(f"/v1/messages/{message_id}/raw")
    assert answer.headers["content-type"].startswith("message/rfc822")
    return answer.content


def test_a_signal_that_finds_stored_mail_names_the_id_it_was_stored_with(
    tenancy_stack: Stack,
) -> None:
    to = f"found-{uuid.uuid4().hex[:6]}@team-a.test"
    mid = send(tenancy_stack, plain(to, "Welcome"), [to])
    with api(tenancy_stack, TOKEN_A) as a:
        wait_listed(a, mid, recipient=to)
        signal = a.post(
            "/v1/signals",
            json={
                "run_id": "r1",
                "test_case": "id",
                "recipient": to,
                "received_after": (datetime.now(UTC) - timedelta(minutes=2)).isoformat(),
            },
        ).json()
        assert "signal_id" in signal, signal
        view = a.get(f"/v1/signals/{signal['signal_id']}", params={"wait": 30}).json()
        assert view["status"] == "found", view
        assert view["message"]["message_id"] == mid, view
        item = wait_listed(a, mid, recipient=to)
        assert item["taken_by"] == signal["signal_id"]
        run = listed(a, run_id="r1", recipient=to)
        assert [i["message_id"] for i in run] == [mid]


def test_search_filters_by_address_subject_attachment_and_negation(tenancy_stack: Stack) -> None:
    to = f"search-{uuid.uuid4().hex[:6]}@team-a.test"
    rich = send(tenancy_stack, rich_mail(to, cc=None).raw, [to])
    other = send(tenancy_stack, plain(to, "Shipping notice", "parcel arrives tomorrow"), [to])
    with api(tenancy_stack, TOKEN_A) as a:
        wait_listed(a, rich, recipient=to)
        wait_listed(a, other, recipient=to)

        def ids(q: str) -> set[str]:
            return {i["message_id"] for i in listed(a, q=q, recipient=to)}

        assert ids(f'to:{to} subject:"invoice"') == {rich}
        assert ids(f"to:{to} -subject:invoice") == {other}
        assert ids(f"to:{to} has:attachment") == {rich}
        assert ids(f"to:{to} parcel") == {other}
        assert ids(f'to:{to} "arrives tomorrow"') == {other}
        assert ids(f'to:{to} "tomorrow arrives"') == set()
        assert ids(f"to:{to} message-id:invoice-9@brand.test") == {rich}
        assert ids(f"to:{to} from:noreply@brand.test") == {rich}
        assert ids(f"to:{to} is:unread") == {rich, other}
        assert ids(f"to:{to} before:2020-01-01") == set()
        assert ids(f"to:{to} after:2020-01-01") == {rich, other}
        bad = a.get("/v1/messages", params={"q": 'subject:"unclosed'})
        assert bad.status_code == 422
        assert bad.json()["error"]["term"] == 'subject:"unclosed'
        bad = a.get("/v1/messages", params={"q": "after:yesterday-ish"})
        assert bad.status_code == 422 and bad.json()["error"]["term"] == "after:yesterday-ish"
        whole = a.get(f"/v1/messages/{rich}").json()
        pdf = next(x for x in whole["attachments"] if x["filename"] == PDF_NAME)
        got = a.get(f"/v1/messages/{rich}/attachments/{pdf['attachment_id']}")
        assert got.status_code == 200 and len(got.content) == pdf["size"]


def test_pages_are_newest_first_and_keyset_paged_without_repeats(tenancy_stack: Stack) -> None:
    to = f"pages-{uuid.uuid4().hex[:6]}@team-a.test"
    sent = [send(tenancy_stack, plain(to, f"n{i}"), [to]) for i in range(5)]
    with api(tenancy_stack, TOKEN_A) as a:
        wait_listed(a, sent[-1], recipient=to)
        seen: list[str] = []
        cursor = None
        for _ in range(5):
            params: dict[str, Any] = {"recipient": to, "limit": 2}
            if cursor:
                params["cursor"] = cursor
            body = a.get("/v1/messages", params=params).json()
            seen += [i["message_id"] for i in body["items"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == list(reversed(sent))


def test_delete_purges_content_and_keeps_the_summary(tenancy_stack: Stack) -> None:
    to = f"del-{uuid.uuid4().hex[:6]}@team-a.test"
    one = send(tenancy_stack, plain(to, "first"), [to])
    two = send(tenancy_stack, plain(to, "second"), [to])
    three = send(tenancy_stack, plain(to, "third"), [to])
    with api(tenancy_stack, TOKEN_A) as a, api(tenancy_stack, TOKEN_B) as b:
        wait_listed(a, three, recipient=to)
        assert b.delete("/v1/messages", params={"recipient": to}).json() == {"deleted": 0}
        assert a.delete(f"/v1/messages/{one}").status_code == 204
        gone = a.get(f"/v1/messages/{one}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "content_purged"
        assert a.delete("/v1/messages", params={"q": "subject:second", "recipient": to}).json() == {
            "deleted": 1
        }
        items = {i["message_id"]: i for i in listed(a, recipient=to)}
        assert items[one]["purged"] and items[two]["purged"] and not items[three]["purged"]
        assert a.delete("/v1/messages").status_code == 422
