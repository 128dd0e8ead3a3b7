"""The whole message against other tenants and operators: another namespace
gets 404 on every content route and console page, an operator 403; the frame
of the HTML is served with its own Content-Security-Policy; downloads never
render on the console's origin."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.rich_mail import rich_mail
from tests.security.conftest import OPS_TOKEN, TOKEN_A, TOKEN_B
from tests.security.test_console_hardening import sign_in
from tests.stack import Stack

pytestmark = pytest.mark.integration

FRAME_CSP = (
    "default-src 'none'; img-src data: cid:; style-src 'unsafe-inline';"
    " sandbox; form-action 'none'; base-uri 'none'"
)


@dataclass
class Claimed:
    claim_id: str
    message_id: str
    attachment_ids: list[str]


def api(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


@pytest.fixture(scope="module")
def claimed(tenancy_stack: Stack) -> Iterator[Claimed]:
    """A's claimed message to an address of A's own domain."""
    recipient = f"qa-{uuid.uuid4().hex[:6]}@team-a.test"
    # Every recipient A's own (a Cc to an address nobody owns would make the
    # message shared: docs/api.md, "Tenants").
    mail = rich_mail(recipient, cc=None)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with api(tenancy_stack, TOKEN_A) as a:
        signal = a.post(
            "/v1/signals", json={"run_id": run_id, "test_case": "whole", "recipient": recipient}
        ).json()
        tenancy_stack.send(mail.raw, [recipient])
        view = a.get(f"/v1/signals/{signal['signal_id']}", params={"wait": 30}).json()
        assert view["status"] == "found", view
        claim = a.post(f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": run_id}).json()
        body = a.get(f"/v1/claims/{claim['claim_id']}/message").json()
    yield Claimed(
        claim["claim_id"], claim["message_id"], [x["attachment_id"] for x in body["attachments"]]
    )


def content_routes(c: Claimed) -> list[str]:
    return [
        f"/v1/claims/{c.claim_id}/message",
        f"/v1/claims/{c.claim_id}/raw",
        f"/v1/claims/{c.claim_id}/attachments/{c.attachment_ids[1]}",
    ]


def console_pages(c: Claimed) -> list[str]:
    return [
        f"/console/messages/{c.message_id}",
        f"/console/messages/{c.message_id}/html",
        f"/console/messages/{c.message_id}/raw",
        f"/console/messages/{c.message_id}/attachments/{c.attachment_ids[1]}",
    ]


def test_another_namespace_gets_404_on_every_content_route(
    tenancy_stack: Stack, claimed: Claimed
) -> None:
    with api(tenancy_stack, TOKEN_B) as b:
        for path in content_routes(claimed):
            r = b.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert r.json()["error"]["code"] == "not_found"
            assert "Jürgen" not in r.text and "PDF" not in r.text


def test_an_operator_gets_403_ops_forbidden_on_every_content_route(
    tenancy_stack: Stack, claimed: Claimed
) -> None:
    with api(tenancy_stack, OPS_TOKEN) as ops:
        for path in content_routes(claimed):
            r = ops.get(path)
            assert r.status_code == 403, (path, r.status_code)
            assert r.json()["error"]["code"] == "ops_forbidden"


def test_the_console_page_is_the_owners_alone(tenancy_stack: Stack, claimed: Claimed) -> None:
    with httpx.Client(base_url=tenancy_stack.api_url, timeout=60) as owner:
        sign_in(owner, TOKEN_A)
        page = owner.get(console_pages(claimed)[0])
        assert page.status_code == 200
        assert "Rechnung für Jürgen.txt" in page.text and "493817" in page.text
        assert "<script>document.title" not in page.text  # the HTML is only in the frame
        assert '<iframe class="mail" sandbox src=' in page.text
        assert "allow-scripts" not in page.text
        assert "frame-src 'self'" in page.headers["content-security-policy"]
        frame = owner.get(console_pages(claimed)[1])
        assert frame.status_code == 200
        assert frame.headers["content-security-policy"] == FRAME_CSP
        assert frame.headers["x-frame-options"] == "SAMEORIGIN"
        assert "<script>" in frame.text  # as sent; the CSP and the sandbox keep it inert
        assert "cid:logo@brand.test" not in frame.text  # the inline image, as data:
        download = owner.get(console_pages(claimed)[3])
        assert download.status_code == 200 and download.content.startswith(b"%PDF")
        assert download.headers["content-disposition"].startswith("attachment;")
        assert "sandbox" in download.headers["content-security-policy"]
        raw = owner.get(console_pages(claimed)[2])
        assert raw.status_code == 200 and raw.headers["content-type"] == "message/rfc822"
        for odd in ("msg_%00x", "msg_\u2603", "x" * 200):
            r = owner.get(f"/console/messages/{odd}")
            assert r.status_code == 404, odd
        r = owner.get(f"/console/messages/{claimed.message_id}/attachments/att_%00")
        assert r.status_code == 404
    with httpx.Client(base_url=tenancy_stack.api_url, timeout=60) as other:
        sign_in(other, TOKEN_B)
        for path in console_pages(claimed):
            r = other.get(path)
            assert r.status_code == 404, (path, r.status_code)
            assert "Jürgen" not in r.text
    with httpx.Client(base_url=tenancy_stack.api_url, timeout=60) as ops:
        sign_in(ops, OPS_TOKEN)
        for path in console_pages(claimed):
            r = ops.get(path)
            assert r.status_code == 403, (path, r.status_code)
            assert "Jürgen" not in r.text
