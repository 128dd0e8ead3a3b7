"""The console's tables fit a 1280 px window in Chromium: long test cases
(parametrised pytest node ids), long recipients, reasons, `why`s and near
misses wrap inside their cells instead of pushing the table (or the page)
past the window."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.browser.test_console import browser  # noqa: F401 - the fixture
from tests.integration.helpers import mail
from tests.integration.test_diagnosis import create, dead_letter_of
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration

# Every table's box (and the page) against its container, in CSS pixels.
OVERFLOW = """() => {
  const wide = [];
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth + 1) wide.push(`page ${page.scrollWidth}`);
  for (const box of document.querySelectorAll('.scroll, table')) {
    if (box.scrollWidth > box.clientWidth + 1) {
      const head = box.querySelector('th') ? box.querySelector('th').textContent : box.tagName;
      const name = box.className || box.tagName;
      wide.push(`${name} (${head}): ${box.scrollWidth} > ${box.clientWidth}`);
    }
  }
  return wide;
}"""


@pytest.mark.timeout(300)
def test_console_tables_fit_a_1280_px_window(stack: Stack, browser: Any) -> None:  # noqa: F811
    run_id = f"run-wide-{uuid.uuid4().hex[:6]}"
    case = (
        "e2e/test_signup_and_verification.py::TestSignupWithEmailVerification::"
        "test_signup_sends_a_verification_code[chromium-de_DE-premium-plan-long-param-id-0123]"
    )
    domain = f"a-rather-long-subdomain-{uuid.uuid4().hex[:6]}.example-company.test"
    recipient = f"new.user.with.a.long.local.part+signup-verification@{domain}"
    signal = create(
        stack,
        run_id=run_id,
        test_case=case,
        recipient=recipient,
        subject_contains="Verify your account",
        max_checks=5,
    )
    typo = recipient.replace("new.user", "new.usre")
    stack.send(mail(typo, subject="Verify your account", run=run_id), [typo])
    long_subject = "Welcome to the platform, here is everything you need to know " * 3
    stack.send(
        mail(recipient, subject=long_subject, run="run-of-another-job-entirely-xyz"), [recipient]
    )
    dl = dead_letter_of(stack, signal["signal_id"])
    assert dl["near_misses"], dl

    base = stack.api_url
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/console/login")
    page.get_by_label("Token").fill(TOKENS["default"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/console/inbox")
    page.goto(f"{base}/console/dead-letters?run_id={run_id}")
    assert case in page.content()  # the list shows the test case (and must fit)
    wide: dict[str, list[str]] = {}
    for path in (
        "/console",
        "/console/inbox",
        "/console/dead-letters",
        f"/console/dead-letters?run_id={run_id}",
        f"/console/dead-letters/{dl['dead_letter_id']}",
        f"/console/signals/{signal['signal_id']}",
        f"/console/runs/{run_id}",
    ):
        answer = page.goto(base + path)
        assert answer is not None and answer.ok, path
        found = page.evaluate(OVERFLOW)
        if found:
            wide[path] = found
    assert wide == {}
