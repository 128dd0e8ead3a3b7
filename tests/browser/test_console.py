"""The SRE console in a real browser (Debian's Chromium driven by Playwright):
sign in, filter dead letters, open one, redrive it, watch its signal wait and
then find the mail sent over SMTP; CSRF refusals. Screenshots of every page
are saved under the test's directory."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import db_scalar, mail
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-test-deps.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def expired_signal(stack: Stack, run_id: str, token: str | None = None) -> dict:
    with stack.client(token) as api:
        signal = api.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "test_signup_sends_code",
                "recipient": f"user-{uuid.uuid4().hex[:6]}@example.test",
                "subject_contains": "Verify",
                "expires_in_seconds": 1,
            },
        ).json()
    wait_until(
        lambda: db_scalar(
            stack, "SELECT count(*) FROM dead_letters WHERE signal_id = %s", signal["signal_id"]
        ),
        20,
        what="the dead letter",
    )
    with stack.client(token) as api:
        view: dict = api.get(f"/v1/signals/{signal['signal_id']}").json()
    return view


# A real browser on a shared machine: page loads are slower than the suite's default allows.
@pytest.mark.timeout(300)
def test_an_sre_triages_a_dead_letter_in_the_browser(
    stack: Stack, browser: Any, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    run_id = f"run-console-{uuid.uuid4().hex[:6]}"
    view = expired_signal(stack, run_id)
    expired_signal(stack, f"run-else-{uuid.uuid4().hex[:6]}")
    base = stack.api_url
    page = browser.new_page(viewport={"width": 1280, "height": 900})

    page.goto(f"{base}/console")
    assert page.url == f"{base}/console/login"
    page.screenshot(path=shots / "01-login.png", full_page=True)
    page.get_by_label("Token").fill(TOKENS["default"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/console/inbox")  # a tenant lands on its inbox
    page.goto(f"{base}/console")
    assert "Signed in as namespace default" in page.content()
    assert page.get_by_role("heading", name="Open dead letters", exact=True).is_visible()
    cookie = next(c for c in page.context.cookies() if c["name"] == "signalbox_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    assert TOKENS["default"] not in cookie["value"]
    page.screenshot(path=shots / "02-overview.png", full_page=True)

    page.get_by_role("link", name="Dead letters").first.click()
    page.get_by_label("Run id").fill(run_id)
    page.get_by_role("button", name="Apply filters").click()
    page.wait_for_url(re.compile(r".*run_id=run-console.*"))
    rows = page.locator("tbody tr")
    assert rows.count() == 1
    page.screenshot(path=shots / "03-dead-letters-filtered.png", full_page=True)

    dl_id = view["dead_letter"]["dead_letter_id"]
    page.get_by_role("link", name=dl_id).click()
    page.wait_for_url(f"{base}/console/dead-letters/{dl_id}")
    text = page.inner_text("main")
    assert "Recommendation" in text and "Timeline of checks" in text
    page.screenshot(path=shots / "04-dead-letter.png", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=shots / "05-dead-letter-phone.png", full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})

    # CSRF: the same POST without the form's token, or with a forged one, is refused.
    url = f"{base}/console/dead-letters/{dl_id}/discard"
    assert page.request.post(url, form={"note": "x"}).status == 403
    assert page.request.post(url, form={"note": "x", "csrf_token": "forged"}).status == 403
    assert db_scalar(stack, "SELECT state FROM dead_letters WHERE id = %s", dl_id) == "open"

    page.get_by_label("Check budget").first.fill("20")
    page.get_by_role("button", name="Redrive", exact=True).click()
    page.wait_for_url(re.compile(rf".*/console/signals/{view['signal_id']}.*"))
    assert page.inner_text("#signal-status") == "waiting"
    page.screenshot(path=shots / "06-signal-waiting.png", full_page=True)

    stack.send(mail(view["recipient"]), [view["recipient"]])

    def found() -> bool:
        page.goto(f"{base}/console/signals/{view['signal_id']}")
        return page.inner_text("#signal-status") == "found"

    wait_until(found, 30, interval=0.5, what="the signal to turn found in the console")
    assert "493817" not in page.content()  # no body, no code
    page.screenshot(path=shots / "07-signal-found.png", full_page=True)

    page.get_by_role("link", name=run_id).first.click()
    page.wait_for_url(f"{base}/console/runs/{run_id}")
    assert view["signal_id"] in page.content()
    page.screenshot(path=shots / "08-run.png", full_page=True)

    # Bulk discard through the list's form, for the other run.
    page.goto(f"{base}/console/dead-letters?state=open")
    page.screenshot(path=shots / "09-dead-letters-open.png", full_page=True)
    page.get_by_label("Note (why)").fill("known staging flake")
    page.get_by_role("button", name="Discard matching").click()
    page.wait_for_url(re.compile(r".*done=discarded.*"))
    assert "1 dead letter(s) discarded." in page.inner_text("main")
    assert "state=open" in page.url  # back on the same filters
    assert page.locator("tbody tr").count() == 0  # nothing open is left
    page.screenshot(path=shots / "10-bulk-discarded.png", full_page=True)

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{base}/console/login")
    page.goto(f"{base}/console")
    assert page.url == f"{base}/console/login"


def test_login_without_the_forms_csrf_token_is_refused(stack: Stack, browser: Any) -> None:
    page = browser.new_page()
    response = page.request.post(
        f"{stack.api_url}/console/login", form={"token": TOKENS["default"]}
    )
    assert response.status == 403
    assert not [c for c in page.context.cookies() if c["name"] == "signalbox_console"]


def test_a_tenant_console_never_shows_another_namespace(stack: Stack, browser: Any) -> None:
    theirs = expired_signal(stack, "run-theirs", token=TOKENS["other"])
    page = browser.new_page()
    page.goto(f"{stack.api_url}/console/login")
    page.get_by_label("Token").fill(TOKENS["default"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{stack.api_url}/console/inbox")
    dl_id = theirs["dead_letter"]["dead_letter_id"]
    response = page.goto(f"{stack.api_url}/console/dead-letters/{dl_id}")
    assert response is not None and response.status == 404
    page.goto(f"{stack.api_url}/console/dead-letters?namespace=other")
    assert dl_id not in page.content()
