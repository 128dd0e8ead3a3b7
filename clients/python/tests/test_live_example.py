"""The signup example suite, run as a user would, leaves an evidence artifact with a receipt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from live_helpers import REPO_ROOT, cli_env, new_run_id, run_pytest

pytestmark = pytest.mark.acceptance


def test_signup_example_passes_and_writes_evidence(live_stack: Any, tmp_path: Path) -> None:
    run_id = new_run_id("example")
    env = cli_env(
        live_stack,
        SIGNALBOX_SMTP_HOST=str(live_stack.smtp_host),
        SIGNALBOX_SMTP_PORT=str(live_stack.smtp_port),
    )
    result = run_pytest(
        "examples/signup",
        "--signalbox-run-id",
        run_id,
        "--signalbox-evidence",
        str(tmp_path),
        cwd=REPO_ROOT,
        env=env,
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    artifact = json.loads((tmp_path / f"{run_id}.json").read_text())
    assert artifact["run_id"] == run_id
    signals = artifact["signals"]
    # The signup test and the one whose first two deliveries get a 451.
    assert len(signals) == 2 and all(s["receipt"]["receipt_id"] for s in signals)
