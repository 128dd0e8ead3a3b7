"""Helpers shared by the acceptance tests that run against the live stack."""

from __future__ import annotations

import os
import smtplib
import subprocess
import sys
import uuid
from email.message import EmailMessage
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]


def new_run_id(prefix: str = "client") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def send_email(
    stack: Any,
    to: str,
    subject: str,
    body: str,
    run_marker: str | None = None,
) -> None:
    """Deliver one message to the stack's SMTP sink."""
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = to
    msg["Subject"] = subject
    if run_marker:
        msg["X-Signalbox-Run"] = run_marker
    msg.set_content(body, cte="7bit")
    with smtplib.SMTP(stack.smtp_host, int(stack.smtp_port), timeout=60) as smtp:
        smtp.send_message(msg)


def signalbox_bin() -> str:
    """The installed ``signalbox`` console script of this interpreter's environment."""
    candidate = Path(sys.executable).parent / "signalbox"
    return str(candidate) if candidate.exists() else "signalbox"


def cli_env(stack: Any, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update({"SIGNALBOX_URL": stack.api_url, "SIGNALBOX_TOKEN": stack.token})
    env.update(extra)
    return env


def run_pytest(
    *args: str, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -q -p no:cacheprovider ARGS`` in a subprocess, as a user
    runs a suite, with its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
