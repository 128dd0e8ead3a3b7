"""A user's pytest suite with one failing email test, run in a subprocess
against the live stack: the plugin cancels what the test left waiting (no dead
letter, even past the deadline) and keeps the failed test's mailbox and mail;
the passing test's mailbox is deleted as before."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from live_helpers import cli_env, new_run_id, run_pytest

pytestmark = pytest.mark.acceptance

SUITE = """
import smtplib
import os
from email.message import EmailMessage


def send(to, subject):
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = to
    msg["Subject"] = subject
    msg.set_content("Your code is 493817")
    host, port = os.environ["APP_SMTP_HOST"], int(os.environ["APP_SMTP_PORT"])
    with smtplib.SMTP(host, port, timeout=30) as smtp:
        smtp.send_message(msg)


def test_signup_broken(mailbox, signalbox_watch):
    verify = signalbox_watch(mailbox.address, subject_contains="Verify", expires_in_seconds=3)
    welcome = signalbox_watch(mailbox.address, subject_contains="Welcome", expires_in_seconds=3)
    send(mailbox.address, "Verify your account")
    verify.wait(timeout=20)
    print("KEPT", mailbox.address, verify.signal_id, welcome.signal_id)
    assert "form" == "shown", "the page never showed the form"


def test_signup_fine(mailbox, signalbox_watch):
    handle = signalbox_watch(mailbox.address, subject_contains="Verify")
    send(mailbox.address, "Verify your account")
    handle.wait(timeout=20)
    with handle.claim() as claim:
        assert list(claim.codes) == ["493817"]
    print("DELETED", mailbox.address)
"""


def test_a_failed_email_test_leaves_no_dead_letter_and_its_mail_readable(
    live_stack: Any, tmp_path: Path
) -> None:
    run_id = new_run_id("failing")
    (tmp_path / "test_app.py").write_text(SUITE)
    env = cli_env(
        live_stack, APP_SMTP_HOST=str(live_stack.smtp_host), APP_SMTP_PORT=str(live_stack.smtp_port)
    )
    done = run_pytest(
        "-s",
        "-p",
        "no:randomly",
        "--signalbox-run-id",
        run_id,
        "test_app.py",
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    # -q prints each test's letter on the line its output continues.
    kept = re.search(r"KEPT (\S+) (\S+) (\S+)", done.stdout)
    deleted_match = re.search(r"DELETED (\S+)", done.stdout)
    assert kept and deleted_match, done.stdout
    address, verify_id, welcome_id = kept.groups()
    deleted = deleted_match.group(1)

    # Past both deadlines: the sweep would have dead-lettered the waiting one.
    time.sleep(4)
    headers = {"Authorization": f"Bearer {live_stack.token}"}
    with httpx.Client(base_url=live_stack.api_url, headers=headers, timeout=30) as api:
        dead = api.get("/v1/dead-letters", params={"run_id": run_id, "state": "open"}).json()
        assert dead["items"] == []
        verify = api.get(f"/v1/signals/{verify_id}").json()
        welcome = api.get(f"/v1/signals/{welcome_id}").json()
        evidence = api.get(f"/v1/runs/{run_id}/evidence").json()
    assert (verify["status"], verify["cancellation"]["reason"]) == ("cancelled", "test_failed")
    assert (welcome["status"], welcome["cancellation"]["reason"]) == ("cancelled", "test_failed")
    assert verify["message"]["subject"] == "Verify your account"
    assert evidence["summary"]["by_status"] == {"cancelled": 2, "consumed": 1}

    # The failed test's mail is still there to read; the passed test's is purged.
    with psycopg.connect(live_stack.env["SIGNALBOX_DATABASE_URL"], autocommit=True) as conn:
        readable = conn.execute(
            "SELECT raw IS NOT NULL FROM messages WHERE id = %s",
            (verify["message"]["message_id"],),
        ).fetchone()
        live = conn.execute(
            "SELECT address FROM mailboxes WHERE deleted_at IS NULL AND address = ANY(%s)",
            ([address, deleted],),
        ).fetchall()
    assert readable == (True,)
    assert live == [(address,)]
