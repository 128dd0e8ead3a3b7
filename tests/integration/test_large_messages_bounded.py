"""Forty 25 MiB messages to one watched address (issue 45): every pushed look
reads the window's rows without their bytes and parses each message once, a
batch of at most SIGNALBOX_LOOK_MAX_BYTES at a time, and the parse cache is
bounded by bytes. No process of the stack grows past 1 GiB of resident
memory, and every signal on the address (and on a typo of it) ends as it
should while a client lists them."""

from __future__ import annotations

import email.policy
import os
import smtplib
import threading
import uuid
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, insert_sink_message, wait_result
from tests.stack import LOOPBACK, Stack

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
MESSAGES = 40
PUSHED = 4
GIB_KIB = 1024 * 1024


def peak_kib(pid: int) -> int:
    """The process's peak resident set so far (VmHWM), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (a worker's pool children, parse processes)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        one = todo.pop()
        found.append(one)
        todo += parents.get(one, [])
    return found


def export(recipient: str) -> bytes:
    """A 25 MiB export (a short text part and two base64 attachments) whose
    subject line is `Subject: Export NNN ready` once numbered."""
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = "reports@example.test"
    msg["To"] = recipient
    msg["Subject"] = "Export NNN ready"
    msg.set_content("The export is attached.\n")
    blob = os.urandom(9_400_000)
    msg.add_attachment(blob, maintype="application", subtype="pdf", filename="export.pdf")
    msg.add_attachment(blob[::-1], maintype="application", subtype="zip", filename="data.zip")
    raw = msg.as_bytes()
    assert 24 * MIB < len(raw) <= 25 * MIB
    return raw


@pytest.mark.timeout(420)
def test_forty_25_mib_messages_to_one_watched_address_keep_every_process_under_1_gib(
    stack: Stack,
) -> None:
    address = f"exports-{uuid.uuid4().hex[:6]}@example.test"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    expect: dict[str, str] = {}
    for i in (MESSAGES // 4, MESSAGES - 2):
        s = create_signal(
            stack, run_id=run_id, recipient=address, subject_contains=f"Export {i:03d} ready",
            expires_in_seconds=300,
        )  # fmt: skip
        expect[s["signal_id"]] = "found"
    for _ in range(2):
        s = create_signal(
            stack, run_id=run_id, recipient=address, subject_contains="never sent",
            expires_in_seconds=40,
        )  # fmt: skip
        expect[s["signal_id"]] = "expired"
    # A typo of the address: at its expiry the typo scan reads the big mails.
    typo = create_signal(
        stack, run_id=run_id, recipient=address.replace("exports-", "exprots-"),
        expires_in_seconds=40,
    )  # fmt: skip
    expect[typo["signal_id"]] = "expired"

    listed: list[int] = []
    stop = threading.Event()

    def lister() -> None:
        with stack.client() as api:
            while not stop.wait(0.5):
                listed.append(api.get("/v1/signals", params={"run_id": run_id}).status_code)

    listing = threading.Thread(target=lister, daemon=True)
    listing.start()
    raw = export(address)

    def numbered(i: int) -> bytes:
        return raw.replace(b"Export NNN ready", f"Export {i:03d} ready".encode(), 1)

    # Most of the forty are stored as the sink stores them, without the push
    # (sending 1 GiB through SMTP here takes minutes); the last ones come
    # through SMTP, and each pushes a look at a window of up to 40 of them.
    for i in range(MESSAGES - PUSHED):
        insert_sink_message(stack, address, numbered(i))
    with smtplib.SMTP(LOOPBACK, stack.smtp_port, timeout=300) as smtp:
        for i in range(MESSAGES - PUSHED, MESSAGES):
            smtp.sendmail("reports@example.test", [address], numbered(i))

    ends = {sid: wait_result(stack, sid, wait=60) for sid in expect}
    for sid in expect:
        if ends[sid]["status"] in ("waiting", "provider_error"):
            ends[sid] = wait_result(stack, sid, wait=60)
    stop.set()
    listing.join(5)

    assert {sid: v["status"] for sid, v in ends.items()} == expect
    assert ends[typo["signal_id"]]["expiry_reason"] == "deadline"
    whys = {n["why"] for n in ends[typo["signal_id"]]["dead_letter"]["near_misses"]}
    assert "recipient_typo" in whys, whys
    assert listed and set(listed) == {200}
    peaks = {
        f"{name}[{pid}]": peak_kib(pid)
        for name in ("api", "smtp", "worker", "beat")
        for pid in tree(stack.procs[name].pid)
    }
    over = {name: kib // 1024 for name, kib in peaks.items() if kib >= GIB_KIB}
    assert not over, f"peak resident MiB over 1 GiB: {over} (all: {peaks})"


def test_the_sink_look_reads_a_window_without_its_bytes(stack: Stack) -> None:
    """The search returns each message's size, not its bytes: the look reads
    the bytes of the messages it must parse (`raw` None, `size` set)."""
    from app.db.engine import get_engine
    from app.providers.base import SearchQuery
    from app.providers.sink import SinkProvider

    address = f"size-{uuid.uuid4().hex[:6]}@example.test"
    signal = create_signal(stack, recipient=address, subject_contains="Export 001 ready")
    raw = b"From: a@example.test\r\nTo: " + address.encode() + b"\r\n"
    raw += b"Subject: Export 001 ready\r\n\r\n" + (b"x" * 76 + b"\r\n") * 1000
    stack.send(raw, [address])
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
    since = datetime.now(UTC) - timedelta(minutes=5)
    try:
        found = SinkProvider().search(SearchQuery(since=since, recipients=frozenset({address})))
    finally:
        get_engine().dispose()  # its connections closed here, not left to the next test
    assert [(m.raw, m.raw_size) for m in found] == [(None, len(raw))]
