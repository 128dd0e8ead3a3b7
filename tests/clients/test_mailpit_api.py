"""Tests written for Mailpit run against Signalbox: the real `mailpit-api` npm
package (scripts/install-test-deps.sh installs it into .signalbox/node) drives
the Mailpit-compatible API with Node's test runner
(tests/clients/mailpit/mailpit_api.test.mjs); a second namespace sees none of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.clients.test_typescript import run
from tests.stack import ROOT, TOKENS, Stack

pytestmark = pytest.mark.integration

NODE_DIR = ROOT / ".signalbox" / "node"
MODULE = NODE_DIR / "node_modules" / "mailpit-api" / "package.json"
TEST = Path(__file__).parent / "mailpit" / "mailpit_api.test.mjs"


@pytest.mark.timeout(300)
def test_the_mailpit_api_client_runs_unchanged_against_signalbox(stack: Stack) -> None:
    if not MODULE.exists():
        pytest.fail("mailpit-api is missing: run scripts/install-test-deps.sh")
    env = {
        "SIGNALBOX_URL": stack.api_url,
        "TOKEN_A": TOKENS["default"],
        "TOKEN_B": TOKENS["other"],
        "SIGNALBOX_SMTP_HOST": stack.smtp_host,
        "SIGNALBOX_SMTP_PORT": str(stack.smtp_port),
        "MAILPIT_API_MODULE": str(MODULE),
        "NO_COLOR": "1",
    }
    out = run(["node", "--test", "--test-reporter=spec", str(TEST)], ROOT, env)
    assert re.search(r"^\S*\s*pass 1$", out, re.M), out
    assert re.search(r"^\S*\s*fail 0$", out, re.M), out
