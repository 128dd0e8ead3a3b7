"""A message's console page in a real browser (Debian's Chromium): its HTML
renders in the sandboxed frame, a <script> in the mail does not run, an
<img src="http://127.0.0.1:PORT/…"> in it is never fetched (a local HTTP
server counts every request it gets), and the page is reached from the
signal's page. A screenshot is saved under the test's directory."""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.browser.test_console import browser  # noqa: F401 - the fixture
from tests.integration.helpers import create_signal, wait_result
from tests.integration.rich_mail import rich_mail
from tests.servers import LOOPBACK
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def tracker() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server and the paths it was asked for."""
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits})
    server = http.server.ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}/pixel.png", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timeout(300)
def test_the_message_page_renders_the_html_without_its_script_or_remote_image(
    stack: Stack,
    browser: Any,  # noqa: F811 - the fixture imported above
    tracker: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    remote, hits = tracker
    recipient = f"buyer-{uuid.uuid4().hex[:8]}@example.test"
    mail = rich_mail(recipient, remote=remote)
    signal = create_signal(stack, recipient=recipient)
    stack.send(mail.raw, [recipient])
    view = wait_result(stack, signal["signal_id"], wait=30)
    assert view["status"] == "found", view
    message_id = view["message"]["message_id"]

    base = stack.api_url
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    page.goto(f"{base}/console/login")
    page.get_by_label("Token").fill(TOKENS["default"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/console/inbox")

    page.goto(f"{base}/console/signals/{signal['signal_id']}")
    page.get_by_role("link", name=message_id).click()
    page.wait_for_url(f"{base}/console/messages/{message_id}")
    assert page.inner_text("#message-subject") == "Your invoice ✓ is ready"
    assert "your code is 493817" in page.inner_text("#message-text")
    assert page.get_by_role("link", name="Rechnung für Jürgen.txt").is_visible()
    assert page.get_by_role("link", name="invoice-2026.pdf").is_visible()

    frame_element = page.locator("iframe.mail")
    assert frame_element.get_attribute("sandbox") == ""
    frame = page.frame_locator("iframe.mail")
    heading = frame.locator("#hello")
    heading.wait_for()
    assert heading.inner_text() == "Invoice ready"
    assert frame.locator("a", has_text="Pay now").is_visible()
    # The inline image (cid:) is drawn; the script never ran.
    assert frame.locator("#logo").evaluate("img => img.complete && img.naturalWidth") == 24
    assert frame.locator("body").get_attribute("data-ran") is None
    inner = next(f for f in page.frames if f.url.endswith(f"/messages/{message_id}/html"))
    assert inner.title() != "SCRIPT RAN"
    page.wait_for_timeout(1500)  # give a remote fetch every chance to happen
    page.screenshot(path=tmp_path / "message-page.png", full_page=True)
    assert hits == []

    # The frame opened on its own is no less inert (its CSP, not only the sandbox).
    alone = browser.new_page()
    alone.context.add_cookies(page.context.cookies())
    alone.goto(f"{base}/console/messages/{message_id}/html")
    assert alone.locator("#hello").inner_text() == "Invoice ready"
    assert alone.title() != "SCRIPT RAN"
    alone.wait_for_timeout(1000)
    assert hits == []

    # The counting server does see a page that is allowed to fetch the image.
    control = browser.new_page()
    control.set_content(f'<img src="{remote}?control">')
    control.wait_for_timeout(500)
    assert hits == ["/pixel.png?control"]

    # Downloads from the page: the PDF as sent.
    with page.expect_download() as download_info:
        page.get_by_role("link", name="invoice-2026.pdf").click()
    download = download_info.value
    assert download.suggested_filename == "invoice-2026.pdf"
    assert Path(download.path()).read_bytes() == mail.pdf


def _hostile_html_mail(recipient: str, remote: str) -> bytes:
    """A mail whose HTML refreshes itself to `remote` and offers a form
    posting to it: harmless only if the frame's document is sandboxed."""
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = recipient
    msg["Subject"] = "Confirm your account"
    msg.set_content("see the HTML part")
    msg.add_alternative(
        "<html><head>"
        f'<meta http-equiv="refresh" content="1;url={remote}?refresh">'
        '<base href="https://evil.example.test/">'
        "</head><body>"
        f'<form id="f" action="{remote}" method="get"><input name="form" value="sent">'
        '<button id="go" type="submit">Go</button></form>'
        "</body></html>",
        subtype="html",
    )
    return bytes(msg)


@pytest.mark.timeout(300)
def test_the_frame_opened_as_a_top_level_page_neither_refreshes_nor_submits_forms(
    stack: Stack,
    browser: Any,  # noqa: F811 - the fixture imported above
    tracker: tuple[str, list[str]],
) -> None:
    """The frame's own CSP carries `sandbox; form-action 'none'; base-uri
    'none'`: opened as a page of the console's origin, a mail's
    `<meta http-equiv=refresh>` and `<form action=…>` reach nothing."""
    remote, hits = tracker
    recipient = f"victim-{uuid.uuid4().hex[:8]}@example.test"
    signal = create_signal(stack, recipient=recipient)
    stack.send(_hostile_html_mail(recipient, remote), [recipient])
    view = wait_result(stack, signal["signal_id"], wait=30)
    assert view["status"] == "found", view
    message_id = view["message"]["message_id"]

    base = stack.api_url
    page = browser.new_page()
    page.goto(f"{base}/console/login")
    page.get_by_label("Token").fill(TOKENS["default"])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/console/inbox")
    page.goto(f"{base}/console/messages/{message_id}/html")
    page.locator("#go").click()
    page.wait_for_timeout(2500)  # past the refresh's second, and the form's navigation
    assert hits == []
    assert page.url == f"{base}/console/messages/{message_id}/html"

    # The same document with no sandbox does reach the counting server.
    control = browser.new_page()
    control.set_content(
        f'<form action="{remote}" method="get"><input name="form" value="sent">'
        '<button id="go" type="submit">Go</button></form>'
    )
    control.locator("#go").click()
    control.wait_for_timeout(1000)
    assert "/pixel.png?form=sent" in hits
