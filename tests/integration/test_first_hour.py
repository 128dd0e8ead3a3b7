"""What a new user meets in the first hour, on the real stack: the polling
hint of a waiting signal, `signalbox-server demo` as the banner says to run it,
mail sent with bare LF line ends."""

from __future__ import annotations

import os
import smtplib
import subprocess
import sys
from email.message import EmailMessage
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_scalar, signal_view, wait_result
from tests.servers import free_port
from tests.stack import ROOT, Stack, wait_until

pytestmark = pytest.mark.integration

# docs/api.md: a pending sink signal's retry_after_seconds is at most 5.
PUSH_HINT_MAX = 5


def test_a_waiting_sink_signal_says_look_again_soon_not_at_its_deadline(stack: Stack) -> None:
    # The sink pushes every arrival, so its next scheduled check is the deadline;
    # the hint must not tell a caller to sleep until then (the mail may come in 3 s).
    signal = create_signal(stack, expires_in_seconds=120)
    sid = signal["signal_id"]
    wait_until(lambda: signal_view(stack, sid)["last_check"], 30, what="the first check")
    view = signal_view(stack, sid, wait=3)
    assert view["result"] == "waiting"
    assert 1 <= view["retry_after_seconds"] <= PUSH_HINT_MAX
    with stack.client() as api:
        early = api.post(f"/v1/signals/{sid}/claim", json={"run_id": signal["run_id"]})
    assert early.status_code == 202, early.text
    assert 1 <= early.json()["retry_after_seconds"] <= PUSH_HINT_MAX


def _demo(env: dict[str, str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    # Nothing of this machine's settings but what is given: no API port, no
    # tokens, an empty data directory (no dev token to fall back on).
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "demo"],
        cwd=ROOT,
        env={**clean, "SIGNALBOX_DATA_DIR": str(data_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_demo_uses_the_url_and_token_the_banner_says_to_export(
    stack: Stack, tmp_path: Path
) -> None:
    done = _demo(
        {
            "SIGNALBOX_URL": stack.api_url,
            "SIGNALBOX_TOKEN": stack.token,
            "SIGNALBOX_SMTP_PORT": str(stack.smtp_port),
        },
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result found" in done.stdout and "consumed: receipt rcp_" in done.stdout


def test_demo_says_in_one_line_that_it_cannot_connect(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = _demo({"SIGNALBOX_URL": url, "SIGNALBOX_TOKEN": "sbx_any"}, tmp_path)
    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: cannot reach Signalbox at " + url)


def test_demo_names_the_token_when_the_api_refuses_it(stack: Stack, tmp_path: Path) -> None:
    done = _demo({"SIGNALBOX_URL": stack.api_url, "SIGNALBOX_TOKEN": "sbx_wrong"}, tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert "401" in done.stderr and "SIGNALBOX_TOKEN" in done.stderr


def _long_bare_lf_mail(to: str) -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "app@example.test", to, "Verify your account"
    # Over 1,000 bytes in all, a line that starts with a dot (smtplib stuffs it).
    body = "".join(f"line {i}: your code is 493817, keep it to yourself\n" for i in range(40))
    msg.set_content(body + ".hidden dot line\n")
    raw = msg.as_bytes()  # line ends: bare LF, as the email package writes them
    assert len(raw) > 1000 and b"\r\n" not in raw
    return raw


def test_a_long_message_with_bare_lf_line_ends_is_accepted_as_received_and_flagged(
    stack: Stack,
) -> None:
    signal = create_signal(stack, subject_contains="Verify")
    raw = _long_bare_lf_mail(signal["recipient"])
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        refused = smtp.sendmail("app@example.test", [signal["recipient"]], raw)
    assert refused == {}
    view = wait_result(stack, signal["signal_id"])
    assert view["result"] == "found"
    assert view["message"]["bare_lf"] is True
    message_id = view["message"]["message_id"]
    # The bytes as received: bare LFs kept, the dot-stuffing undone; smtplib ends
    # the data with the CRLF before its final ".".
    stored = db_scalar(stack, "SELECT raw FROM messages WHERE id = %s", message_id)
    assert bytes(stored) == raw + b"\r\n"
    with stack.client() as api:
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence").json()
    assert evidence["signals"][0]["message"]["bare_lf"] is True


def test_a_message_with_crlf_line_ends_is_not_flagged(stack: Stack) -> None:
    signal = create_signal(stack, subject_contains="Verify")
    raw = _long_bare_lf_mail(signal["recipient"]).replace(b"\n", b"\r\n")
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        smtp.sendmail("app@example.test", [signal["recipient"]], raw)
    view = wait_result(stack, signal["signal_id"])
    assert view["result"] == "found" and view["message"]["bare_lf"] is False
    stored = db_scalar(
        stack, "SELECT raw FROM messages WHERE id = %s", view["message"]["message_id"]
    )
    assert bytes(stored) == raw


def test_a_bare_lf_line_over_the_limit_is_still_refused_as_too_long(stack: Stack) -> None:
    signal = create_signal(stack)
    raw = b"Subject: long\nTo: " + signal["recipient"].encode() + b"\n\n" + b"x" * 1200 + b"\n"
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        try:
            smtp.sendmail("app@example.test", [signal["recipient"]], raw)
        except smtplib.SMTPDataError as exc:
            assert exc.smtp_code == 500 and b"Line too long" in exc.smtp_error
        else:
            raise AssertionError("a 1,200-byte line was accepted")
        assert smtp.noop()[0] == 250  # the session goes on
