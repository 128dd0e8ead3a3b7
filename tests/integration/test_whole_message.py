"""The whole message of a claim on the real stack: fields, attachments and raw
bytes as sent; 410 once the claim ended; the receipt's evidence pins hashes
and carries no content; hostile structure answers bounded, never 500."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.integration.helpers import create_signal, db_scalar, wait_result
from tests.integration.rich_mail import PDF_NAME, TXT_NAME, RichMail, rich_mail
from tests.security.test_console_hardening import sign_in
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def claimed(stack: Stack, raw: bytes, recipient: str, **fields: Any) -> tuple[dict, dict]:
    """A signal on `recipient`, `raw` sent to it over SMTP, found and claimed."""
    signal = create_signal(stack, recipient=recipient, **fields)
    stack.send(raw, [recipient])
    view = wait_result(stack, signal["signal_id"], wait=30)
    assert view["status"] == "found", view
    with stack.client() as api:
        claim = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        )
    assert claim.status_code == 200, claim.text
    return signal, claim.json()


def fresh_recipient() -> str:
    return f"buyer-{uuid.uuid4().hex[:8]}@example.test"


def test_the_whole_message_comes_back_field_for_field_and_byte_for_byte(stack: Stack) -> None:
    mail = rich_mail(fresh_recipient())
    _, claim = claimed(stack, mail.raw, mail.recipient)
    cid = claim["claim_id"]
    with stack.client() as api:
        response = api.get(f"/v1/claims/{cid}/message")
        assert response.status_code == 200, response.text
        body = response.json()
        assert list(body) == [
            "message_id", "from", "to", "cc", "reply_to", "subject", "date", "received_at",
            "headers", "text", "html", "links", "codes", "attachments", "size", "sha256",
        ]  # fmt: skip
        assert body["message_id"] == claim["message_id"]
        assert body["from"] == {"name": "Brand Bäckerei", "address": "noreply@brand.test"}
        assert body["to"] == [{"name": "User One", "address": mail.recipient}]
        assert body["cc"] == [{"name": "", "address": "copy@example.test"}]
        assert body["reply_to"] == [{"name": "Support", "address": "support@brand.test"}]
        assert body["subject"] == "Your invoice ✓ is ready"
        assert body["date"] == "2026-12-01T09:00:00.000Z"
        assert body["received_at"] == claim["received_at"]
        names = [name for name, _ in body["headers"]]
        assert names[:8] == [
            "From", "To", "Cc", "Reply-To", "Subject", "Date", "Message-ID", "List-Unsubscribe",
        ]  # fmt: skip
        assert ["List-Unsubscribe", "<https://brand.test/unsubscribe?u=1>"] in body["headers"]
        assert ["Subject", "Your invoice ✓ is ready"] in body["headers"]
        assert (
            body["text"]
            == "Hello Jürgen,\nyour code is 493817.\nPay at https://brand.test/pay?invoice=9\n"
        )
        assert body["html"] == mail.html + "\n"  # as sent (the encoder ended it with a newline)
        assert body["links"] == [{"url": "https://brand.test/pay?invoice=9", "text": "Pay now"}]
        assert body["codes"] == ["493817"] == claim["codes"]
        assert body["size"] == len(mail.raw)
        assert body["sha256"] == hashlib.sha256(mail.raw).hexdigest()

        inline, pdf, txt = body["attachments"]
        assert inline == {
            "attachment_id": inline["attachment_id"],
            "filename": None,
            "content_type": "image/png",
            "size": len(mail.png),
            "sha256": RichMail.sha(mail.png),
            "inline": True,
            "content_id": "logo@brand.test",
        }
        assert pdf["filename"] == PDF_NAME and pdf["content_type"] == "application/pdf"
        assert (pdf["size"], pdf["sha256"]) == (len(mail.pdf), RichMail.sha(mail.pdf))
        assert pdf["inline"] is False and pdf["content_id"] is None
        assert txt["filename"] == TXT_NAME and txt["content_type"] == "text/plain"
        assert txt["sha256"] == RichMail.sha(mail.txt)

        # Stable ids: the same message gives the same ids every time.
        again = api.get(f"/v1/claims/{cid}/message").json()
        assert [a["attachment_id"] for a in again["attachments"]] == [
            a["attachment_id"] for a in body["attachments"]
        ]

        for item, sent in ((inline, mail.png), (pdf, mail.pdf), (txt, mail.txt)):
            got = api.get(f"/v1/claims/{cid}/attachments/{item['attachment_id']}")
            assert got.status_code == 200
            assert got.content == sent
            assert hashlib.sha256(got.content).hexdigest() == item["sha256"]
            assert got.headers["content-type"].split(";")[0] == item["content_type"]
            assert got.headers["etag"] == f'"{item["sha256"]}"'
            assert got.headers["x-content-type-options"] == "nosniff"
            name = item["filename"] or "attachment"
            assert got.headers["content-disposition"] == (
                "attachment; filename*=UTF-8''" + quote(name, safe="")
            )
        unchanged = api.get(
            f"/v1/claims/{cid}/attachments/{pdf['attachment_id']}",
            headers={"If-None-Match": f'"{pdf["sha256"]}"'},
        )
        assert unchanged.status_code == 304 and not unchanged.content

        raw = api.get(f"/v1/claims/{cid}/raw")
        assert raw.status_code == 200
        assert raw.headers["content-type"] == "message/rfc822"
        assert raw.content == mail.raw


def test_attachment_ids_are_checked(stack: Stack) -> None:
    mail = rich_mail(fresh_recipient())
    _, claim = claimed(stack, mail.raw, mail.recipient)
    cid = claim["claim_id"]
    with stack.client() as api:
        for bad in ("att_xyz", "..%2F..%2Fraw", "att_" + "0" * 25, "ATT_" + "0" * 24):
            r = api.get(f"/v1/claims/{cid}/attachments/{bad}")
            assert r.status_code in (404, 422), (bad, r.status_code)
            if r.status_code == 422:
                assert r.json()["error"]["code"]
        unknown = api.get(f"/v1/claims/{cid}/attachments/att_{'0' * 24}")
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "not_found"
        malformed = api.get(f"/v1/claims/{cid}/attachments/att_nothex")
        assert malformed.status_code == 422
        no_claim = api.get(f"/v1/claims/clm_{'0' * 24}/message")
        assert no_claim.status_code == 404


def test_after_consume_the_content_routes_answer_410_and_evidence_pins_hashes(
    stack: Stack,
) -> None:
    mail = rich_mail(fresh_recipient(), pdf_bytes=5000)
    signal, claim = claimed(stack, mail.raw, mail.recipient)
    cid = claim["claim_id"]
    with stack.client() as api:
        listed = api.get(f"/v1/claims/{cid}/message").json()["attachments"]
        receipt = api.post(f"/v1/claims/{cid}/consume").json()
        for path in ("message", "raw", f"attachments/{listed[1]['attachment_id']}"):
            ended = api.get(f"/v1/claims/{cid}/{path}")
            assert ended.status_code == 410, path
            assert ended.json()["status"] == "consumed"
            assert ended.json()["receipt"]["receipt_id"] == receipt["receipt_id"]
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence").json()

    pinned = receipt["evidence"]
    assert pinned["message_sha256"] == hashlib.sha256(mail.raw).hexdigest()
    assert pinned["attachments"] == [
        {"filename": None, "content_type": "image/png", "size": len(mail.png),
         "sha256": RichMail.sha(mail.png)},
        {"filename": PDF_NAME.replace("2026", "<code>"), "content_type": "application/pdf",
         "size": len(mail.pdf), "sha256": RichMail.sha(mail.pdf)},
        {"filename": TXT_NAME, "content_type": "text/plain", "size": len(mail.txt),
         "sha256": RichMail.sha(mail.txt)},
    ]  # fmt: skip
    text = json.dumps(evidence, ensure_ascii=False)
    assert RichMail.sha(mail.pdf) in text and pinned["message_sha256"] in text
    # No content: no body, no link, no code, no attachment bytes, no header values.
    for secret in ("493817", "brand.test/pay", "Grüße", "Pay now", "noreply@brand.test"):
        assert secret not in text, secret
    assert "invoice-2026" not in text  # the name's code-like part is masked


def test_hostile_structure_is_answered_bounded(stack: Stack) -> None:
    recipient = fresh_recipient()
    head = (
        f"From: a@example.test\r\nTo: {recipient}\r\nSubject: hostile\r\n"
        + "".join(f"X-Filler-{i}: {'y' * 60}\r\n" for i in range(3000))
        + "Content-Type: multipart/mixed; boundary=b0\r\n\r\n"
    ).encode()
    flat = b"".join(
        b"--b0\r\nContent-Type: application/x-part; name=p%d.bin\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\n!!not*base64==AAAA\r\n" % i
        for i in range(5000)
    )
    deep = b"".join(
        b"--n%d\r\nContent-Type: multipart/mixed; boundary=n%d\r\n\r\n" % (i, i + 1)
        for i in range(200)
    )
    raw = (
        head
        + b"--b0\r\nContent-Type: text/plain; charset=bogus-8\r\n\r\nhello \xff\xfe\r\n"
        + b"--b0\r\nContent-Type: multipart/mixed; boundary=n0\r\n\r\n"
        + deep
        + flat
        + b"--b0--\r\n"
    )
    _, claim = claimed(stack, raw, recipient)
    with stack.client() as api:
        response = api.get(f"/v1/claims/{claim['claim_id']}/message")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["size"] == len(raw) and body["text"].startswith("hello")
        assert 0 < len(body["attachments"]) < 1000
        assert len(body["headers"]) <= 1004  # the first 1000, then the MIME ones
        first = body["attachments"][0]
        got = api.get(f"/v1/claims/{claim['claim_id']}/attachments/{first['attachment_id']}")
        assert got.status_code == 200 and len(got.content) == first["size"]
        assert api.get(f"/v1/claims/{claim['claim_id']}/raw").content == raw


def test_the_signal_page_and_each_near_miss_link_to_the_message_page(stack: Stack) -> None:
    recipient = fresh_recipient()
    mail = rich_mail(recipient)  # subject "Your invoice ✓ is ready": not what is awaited
    signal = create_signal(
        stack, recipient=recipient, subject_contains="password reset", expires_in_seconds=3
    )
    stack.send(mail.raw, [recipient])
    wait_until(
        lambda: db_scalar(
            stack, "SELECT count(*) FROM dead_letters WHERE signal_id = %s", signal["signal_id"]
        ),
        30,
        what="the dead letter",
    )
    with stack.client() as api:
        view = api.get(f"/v1/signals/{signal['signal_id']}").json()
    dead = view["dead_letter"]
    with stack.client() as api:
        near = api.get(f"/v1/dead-letters/{dead['dead_letter_id']}").json()["near_misses"]
    assert near and near[0]["why"] == "subject_mismatch"
    with httpx.Client(base_url=stack.api_url, timeout=60) as console:
        sign_in(console, TOKENS["default"])
        page = console.get(f"/console/dead-letters/{dead['dead_letter_id']}").text
        link = f'href="/console/messages/{near[0]["message_id"]}"'
        assert link in page
        shown = console.get(f"/console/messages/{near[0]['message_id']}")
        assert shown.status_code == 200 and "Rechnung für Jürgen.txt" in shown.text

    found_recipient = fresh_recipient()
    _, claim = claimed(stack, rich_mail(found_recipient).raw, found_recipient)
    with httpx.Client(base_url=stack.api_url, timeout=60) as console:
        sign_in(console, TOKENS["default"])
        page = console.get(f"/console/signals/{claim['signal_id']}").text
        assert f'href="/console/messages/{claim["message_id"]}"' in page
