"""The console inbox in Chromium: mail sent while the page is open appears
without a reload; another namespace's never does; a row opens the message's
page; delete; readable at 1280 px and at phone width."""

from __future__ import annotations

from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.test_console import browser  # noqa: F401 - the fixture
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


def mailbox(stack: Stack, token: str) -> str:
    with httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        answer = client.post("/v1/mailboxes", json={"run_id": "inbox-page", "provider": "sink"})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["address"])


def plain(to: str, subject: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = "app@brand.test"
    msg["To"] = to
    msg["Subject"] = subject
    msg.set_content("Hello from the app.")
    return msg.as_bytes()


def sign_in(page: Any, base: str) -> None:
    page.goto(f"{base}/console/login")
    page.get_by_label("Token").fill(TOKENS["default"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/console/inbox")  # a tenant's landing page


def test_new_mail_appears_live_and_another_namespaces_never(
    stack: Stack,
    browser: Any,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    mine, theirs = mailbox(stack, TOKENS["default"]), mailbox(stack, TOKENS["other"])
    stack.send(plain(mine, "Before the page opened"), [mine])
    base = stack.api_url
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, base)
    page.get_by_role("link", name="Inbox").click()
    page.wait_for_url(f"{base}/console/inbox")
    rows = page.locator("table.inbox tbody tr")
    rows.filter(has_text="Before the page opened").wait_for()
    assert rows.count() == 1

    stack.send(plain(theirs, "Not yours"), [theirs])
    stack.send(plain(mine, "Arrived while open"), [mine])
    rows.filter(has_text="Arrived while open").wait_for(timeout=10_000)
    page.wait_for_timeout(500)
    assert rows.count() == 2  # no reload; the other namespace's mail never shows
    assert "Not yours" not in page.inner_text("table.inbox")
    assert rows.first.inner_text().count("Arrived while open") == 1  # newest first
    page.screenshot(path=tmp_path / "inbox-1280.png", full_page=True)

    page.set_viewport_size({"width": 390, "height": 800})
    page.reload()
    rows.first.wait_for()
    # Nothing wider than the phone: no sideways scrolling.
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert rows.first.get_by_role("link", name="Arrived while open").is_visible()
    page.screenshot(path=tmp_path / "inbox-phone.png", full_page=True)

    rows.first.get_by_role("link", name="Arrived while open").click()
    page.wait_for_url(f"{base}/console/messages/msg_*")
    assert "Hello from the app." in page.inner_text("main")
    page.go_back()
    rows.filter(has_text="Before the page opened").get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{base}/console/inbox?done=deleted")
    assert "deleted" in rows.filter(has_text="Before the page opened").inner_text()
