"""What a new user meets in the first hour, on the real stack: the polling
hint of a waiting signal, `signalbox-server demo` as the banner says to run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, signal_view
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
