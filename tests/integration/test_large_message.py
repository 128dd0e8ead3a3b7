"""A message of SIGNALBOX_SMTP_MAX_BYTES' default size (25 MiB) with
attachments through the real stack: received, stored, matched, claimed, read
and downloaded byte for byte, with the sink's and the API's peak resident
memory a few copies of the message (docs/api.md, "Large messages")."""

from __future__ import annotations

import email.policy
import hashlib
import os
import smtplib
import uuid
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_scalar, wait_result
from tests.stack import Stack

pytestmark = pytest.mark.integration

MAX_BYTES = 25 * 1024 * 1024
MIB = 1024 * 1024


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def large_mail(recipient: str, decoded: tuple[int, int]) -> tuple[bytes, list[bytes]]:
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = "reports@example.test"
    msg["To"] = recipient
    msg["Subject"] = "Your monthly export"
    msg.set_content("The export is attached.\n")
    files = [b"%PDF-1.7\n" + os.urandom(decoded[0]), os.urandom(decoded[1])]
    msg.add_attachment(files[0], maintype="application", subtype="pdf", filename="export.pdf")
    msg.add_attachment(files[1], maintype="application", subtype="zip", filename="data.zip")
    return msg.as_bytes(), files


@pytest.mark.timeout(300)
def test_a_25_mib_message_goes_through_with_bounded_memory(stack: Stack) -> None:
    # The sink's default limit is the one under test.
    assert "SIGNALBOX_SMTP_MAX_BYTES" not in stack.env
    recipient = f"export-{uuid.uuid4().hex[:8]}@example.test"
    raw, files = large_mail(recipient, (9_500_000, 9_600_000))
    assert MAX_BYTES - MIB < len(raw) <= MAX_BYTES
    signal = create_signal(stack, recipient=recipient, expires_in_seconds=120)
    stack.send(raw, [recipient])
    view = wait_result(stack, signal["signal_id"], wait=60)
    assert view["status"] == "found", view
    with stack.client() as api:
        claim = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        ).json()
        cid = claim["claim_id"]
        body = api.get(f"/v1/claims/{cid}/message").json()
        assert body["size"] == len(raw)
        assert body["sha256"] == hashlib.sha256(raw).hexdigest()
        assert body["text"] == "The export is attached.\n"
        listed = body["attachments"]
        assert [a["filename"] for a in listed] == ["export.pdf", "data.zip"]
        for item, sent in zip(listed, files, strict=True):
            digest = hashlib.sha256()
            size = 0
            with api.stream("GET", f"/v1/claims/{cid}/attachments/{item['attachment_id']}") as r:
                assert r.status_code == 200
                assert int(r.headers["content-length"]) == len(sent)
                for chunk in r.iter_bytes():
                    digest.update(chunk)
                    size += len(chunk)
            assert (size, digest.hexdigest()) == (len(sent), hashlib.sha256(sent).hexdigest())
            assert item["sha256"] == digest.hexdigest()
        assert api.get(f"/v1/claims/{cid}/raw").content == raw
        receipt = api.post(f"/v1/claims/{cid}/consume").json()
    assert receipt["evidence"]["message_sha256"] == hashlib.sha256(raw).hexdigest()

    # A few copies of the message each (docs/api.md says how many), above the
    # processes' own footprint; nothing near one copy per chunk or per part.
    for name in ("smtp", "api"):
        peak = peak_rss_mib(stack.procs[name].pid)
        print(f"{name} peak RSS {peak:.0f} MiB")
        assert peak < 200 + 8 * len(raw) / MIB, (name, peak)


def test_one_byte_over_the_limit_is_refused_and_nothing_is_stored(stack: Stack) -> None:
    recipient = f"big-{uuid.uuid4().hex[:8]}@example.test"
    head = f"From: a@example.test\r\nTo: {recipient}\r\nSubject: too big\r\n\r\n".encode()
    line = b"x" * 998 + b"\r\n"
    body = line * ((MAX_BYTES - len(head)) // len(line) + 1)
    raw = head + body
    assert len(raw) > MAX_BYTES
    with (
        smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=120) as smtp,
        pytest.raises(smtplib.SMTPException) as refused,
    ):
        smtp.sendmail("a@example.test", [recipient], raw)
    assert "552" in str(refused.value) or getattr(refused.value, "smtp_code", 0) == 552
    with stack.client() as api:
        assert api.get("/healthz").status_code == 200
    assert (
        db_scalar(
            stack, "SELECT count(*) FROM sink_messages WHERE %s = ANY(all_recipients)", recipient
        )
        == 0
    )
