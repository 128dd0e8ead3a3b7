"""The whole message through the client, the CLI and the MCP server against the
running stack: the README's attachment test, its async twin, and
``signalbox message`` / ``signalbox claim --save-attachments`` as subprocesses."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from live_helpers import cli_env, new_run_id, signalbox_bin
from signalbox import AsyncSignalbox, Signalbox
from signalbox.message import ClaimEnded

from tests.integration.rich_mail import PDF_NAME, TXT_NAME, RichMail, rich_mail

pytestmark = pytest.mark.acceptance


def mailed(live_stack: Any, sb: Signalbox, run_id: str) -> tuple[Any, RichMail]:
    box = sb.mailbox(run_id)
    handle = sb.watch(run_id, "test_invoice_email_carries_the_pdf", box.address,
                      subject_contains="invoice")  # fmt: skip
    mail = rich_mail(box.address, cc=None)
    live_stack.send(mail.raw, [box.address])
    return handle, mail


def test_the_readme_attachment_test_passes(live_stack: Any, tmp_path: Path) -> None:
    with Signalbox(live_stack.api_url, live_stack.token) as sb:
        handle, sent = mailed(live_stack, sb, new_run_id("readme"))
        # The README's test, as written there.
        handle.wait(timeout=60)
        with handle.claim() as claim:
            mail = claim.message()
            assert mail.from_ is not None and mail.from_.address == "noreply@brand.test"
            assert mail.header("List-Unsubscribe")
            assert "your code is 493817" in mail.text
            pdf = mail.attachment(PDF_NAME)
            assert pdf is not None and pdf.content_type == "application/pdf"
            assert pdf.read().startswith(b"%PDF")
            # ... and byte for byte what was sent.
            assert pdf.sha256 == RichMail.sha(sent.pdf)
            assert pdf.save(tmp_path).read_bytes() == sent.pdf
            assert sb.raw_message(claim.claim_id) == sent.raw
        with pytest.raises(ClaimEnded) as ended:
            sb.message(claim.claim_id)
        assert ended.value.state == "consumed"


def test_the_async_client_reads_the_same_message(live_stack: Any) -> None:
    with Signalbox(live_stack.api_url, live_stack.token) as sb:
        handle, sent = mailed(live_stack, sb, new_run_id("async"))
        handle.wait(timeout=60)
        signal_id, run_id = handle.signal_id, handle.run_id

    async def go() -> bytes:
        async with AsyncSignalbox(live_stack.api_url, live_stack.token) as client:
            h = await client.signal(signal_id)
            assert h.run_id == run_id
            async with h.claim() as claim:
                mail = await claim.message()
                txt = mail.attachment(TXT_NAME)
                assert txt is not None
                return await txt.read()

    assert asyncio.run(go()) == sent.txt


def cli(stack: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [signalbox_bin(), *args], env=cli_env(stack), capture_output=True, text=True, timeout=90
    )


def test_the_cli_saves_attachments_and_prints_the_message(live_stack: Any, tmp_path: Path) -> None:
    run_id = new_run_id("cli-msg")
    with Signalbox(live_stack.api_url, live_stack.token) as sb:
        handle, sent = mailed(live_stack, sb, run_id)
        handle.wait(timeout=60)
    claimed = cli(live_stack, "claim", handle.signal_id, "--run-id", run_id,
                  "--save-attachments", str(tmp_path), "--json")  # fmt: skip
    assert claimed.returncode == 0, claimed.stderr
    body = json.loads(claimed.stdout)
    assert (tmp_path / PDF_NAME).read_bytes() == sent.pdf
    assert (tmp_path / TXT_NAME).read_bytes() == sent.txt
    assert len(body["saved_attachments"]) == 3
    shown = cli(live_stack, "message", body["claim_id"])
    assert shown.returncode == 0, shown.stderr
    assert "List-Unsubscribe" in shown.stdout and PDF_NAME in shown.stdout
    assert "your code is 493817" in shown.stdout
    assert "<script>" not in shown.stdout  # the HTML is not printed, only the text
