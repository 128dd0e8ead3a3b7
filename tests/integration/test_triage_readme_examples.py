"""The README's shell and Python examples run as written against the live
stack, with SIGNALBOX_URL and SIGNALBOX_TOKEN set as the README says, and run
again right after (a second run is a new run, never the first one's signal)."""

from __future__ import annotations

import os
import re
import smtplib
import subprocess
from email.message import EmailMessage

import pytest
from signalbox import Signalbox

from tests.stack import ROOT, Stack

pytestmark = pytest.mark.integration


def api_examples() -> list[str]:
    """The ```bash blocks that call the API (curl or the signalbox CLI)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    return [b for b in blocks if re.search(r"^\s*(curl|\S*signalbox |signal_id=\$\(curl)", b, re.M)]


def test_the_readme_has_api_examples_that_send_json_properly() -> None:
    examples = api_examples()
    assert len(examples) >= 2
    for block in examples:
        for command in re.findall(r"curl[^\n]*(?:\\\n[^\n]*)*", block):
            if " -d " in command:
                assert "Content-Type: application/json" in command, command


def run_block(stack: Stack, block: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SIGNALBOX_URL": stack.api_url,
        "SIGNALBOX_TOKEN": stack.token,
    }
    # Run from the checkout, as the README says: its .venv/bin/signalbox is the CLI.
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{block}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done


@pytest.mark.parametrize("index", range(len(api_examples())))
def test_readme_example_runs_against_the_live_stack_twice_in_a_row(
    stack: Stack, index: int
) -> None:
    block = api_examples()[index]
    first, second = run_block(stack, block), run_block(stack, block)
    if "POST" in block and "/v1/signals" in block:  # the example that creates a signal
        ids = [
            re.findall(r'"signal_id":"(sig_[^"]+)"', d.stdout.replace(" ", ""))
            for d in (first, second)
        ]
        assert ids[0] and ids[1] and set(ids[0]).isdisjoint(ids[1])  # two runs, two signals
        assert '"items"' in second.stdout


def python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    return next(b for b in blocks if "handle.wait(" in b)


def test_the_readme_python_example_runs_twice_in_a_row(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example as written; `app.sign_up` and `follow` are the reader's own
    code, played here by a sender of a verification mail and a list."""
    monkeypatch.setenv("SIGNALBOX_URL", stack.api_url)
    monkeypatch.setenv("SIGNALBOX_TOKEN", stack.token)

    class App:
        def sign_up(self, address: str) -> None:
            msg = EmailMessage()
            msg["From"], msg["To"], msg["Subject"] = "app@example.test", address, "Please verify"
            msg.set_content("Open https://app.example.test/verify?t=abc123 to finish.")
            with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
                smtp.send_message(msg)

    runs = []
    for _ in range(2):
        followed: list[str] = []
        scope: dict[str, object] = {"app": App(), "follow": followed.append}
        exec(compile(python_example(), "README.md", "exec"), scope)
        handle = scope["handle"]
        runs.append((scope["run_id"], handle.signal_id))  # type: ignore[attr-defined]
        assert followed == ["https://app.example.test/verify?t=abc123"]
        assert handle.refresh().result == "consumed"  # type: ignore[attr-defined]
        # A reader's script ends with its process; here the client it made is
        # closed, so its connections never outlive the test.
        for value in scope.values():
            if isinstance(value, Signalbox):
                value.close()
    assert runs[0][0] != runs[1][0] and runs[0][1] != runs[1][1]
