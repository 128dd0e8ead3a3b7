"""The README's shell examples run as written against the live stack, with
SIGNALBOX_URL and SIGNALBOX_TOKEN set as the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import ROOT, Stack

pytestmark = pytest.mark.integration


def api_examples() -> list[str]:
    """The ```bash blocks that call the API (curl or the signalbox CLI)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    return [b for b in blocks if re.search(r"^\s*(curl|signalbox |signal_id=\$\(curl)", b, re.M)]


def test_the_readme_has_api_examples_that_send_json_properly() -> None:
    examples = api_examples()
    assert len(examples) >= 2
    for block in examples:
        for command in re.findall(r"curl[^\n]*(?:\\\n[^\n]*)*", block):
            if " -d " in command:
                assert "Content-Type: application/json" in command, command


@pytest.mark.parametrize("index", [0, 1])
def test_readme_example_runs_against_the_live_stack(
    stack: Stack, index: int, tmp_path: Path
) -> None:
    block = api_examples()[index]
    env = {
        **os.environ,
        "SIGNALBOX_URL": stack.api_url,
        "SIGNALBOX_TOKEN": stack.token,
        # The `signalbox` CLI of this checkout.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{block}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    if index == 0:
        assert '"signal_id":"sig_' in done.stdout.replace(" ", "")
        assert '"items"' in done.stdout
