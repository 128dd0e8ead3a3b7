"""The console over plain HTTP (no browser): sessions, CSRF, escaping,
operators across namespaces, tampered cookies."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.helpers import OPS_TOKEN, db_scalar
from tests.integration.test_triage_api import expired
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


# A tenant lands on its inbox, an operator on the overview.
LANDINGS = ("/console/inbox", "/console")


@contextlib.contextmanager
def sign_in(base: str, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=60) as client:
        page = client.get("/console/login")
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert csrf, page.text
        done = client.post("/console/login", data={"token": token, "csrf_token": csrf.group(1)})
        assert done.status_code == 303 and done.headers["location"] in LANDINGS, done.text
        yield client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found
    return found.group(1)


@pytest.fixture
def ops_base(ops_stack: Stack) -> str:
    return ops_stack.api_url


def test_without_a_session_every_page_redirects_to_login(stack: Stack) -> None:
    for path in ("/console", "/console/dead-letters", "/console/signals/sig_x", "/console/runs/r"):
        response = httpx.get(stack.api_url + path)
        assert response.status_code == 303 and response.headers["location"] == "/console/login"


def test_a_wrong_token_is_refused_and_sets_no_session(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url) as client:
        csrf = csrf_of(client.get("/console/login").text)
        response = client.post("/console/login", data={"token": "nope", "csrf_token": csrf})
        assert response.status_code == 401
        assert "signalbox_console" not in response.cookies


def test_a_tampered_session_cookie_is_not_a_session(stack: Stack) -> None:
    with sign_in(stack.api_url, TOKENS["other"]) as client:
        value = client.cookies["signalbox_console"]
        body, _, mac = value.rpartition(".")
        # Claim to be another namespace with the old signature.
        import base64
        import json

        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        data["n"] = "default"
        forged = base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
        client.cookies.set("signalbox_console", f"{forged}.{mac}", path="/console")
        response = client.get("/console")
    assert response.status_code == 303


def test_hostile_text_is_escaped_and_content_never_shown(stack: Stack) -> None:
    [view] = expired(stack, 1, test_case="<script>alert(1)</script>")
    dl_id = view["dead_letter"]["dead_letter_id"]
    with sign_in(stack.api_url, TOKENS["default"]) as client:
        page = client.get(f"/console/dead-letters/{dl_id}")
        done = client.post(
            f"/console/dead-letters/{dl_id}/discard",
            data={"note": "<img src=x onerror=alert(1)>", "csrf_token": csrf_of(page.text)},
        )
        shown = client.get(f"/console/dead-letters/{dl_id}")
        signal = client.get(f"/console/signals/{view['signal_id']}")
        spoofed = client.get("/console/dead-letters", params={"done": "Call 555-0100 now"})
    assert done.status_code == 303
    assert "<img src=x" not in shown.text and "&lt;img src=x" in shown.text
    assert "<script>alert" not in signal.text and "&lt;script&gt;" in signal.text
    assert "default-src 'none'" in signal.headers["content-security-policy"]
    assert "Call 555-0100" not in spoofed.text
    assert db_scalar(stack, "SELECT state FROM dead_letters WHERE id = %s", dl_id) == "discarded"


def test_a_csrf_token_of_another_session_is_refused(stack: Stack) -> None:
    [view] = expired(stack, 1)
    dl_id = view["dead_letter"]["dead_letter_id"]
    with (
        sign_in(stack.api_url, TOKENS["default"]) as mine,
        sign_in(stack.api_url, TOKENS["default"]) as theirs,
    ):
        their_csrf = csrf_of(theirs.get("/console").text)
        refused = mine.post(
            f"/console/dead-letters/{dl_id}/redrive", data={"csrf_token": their_csrf}
        )
    assert refused.status_code == 403
    assert db_scalar(stack, "SELECT state FROM dead_letters WHERE id = %s", dl_id) == "open"


def test_an_operator_sees_and_redrives_every_namespace(stack: Stack, ops_base: str) -> None:
    run_id = f"run-ops-{uuid.uuid4().hex[:6]}"
    [mine] = expired(stack, 1, run_id=run_id)
    [theirs] = expired(stack, 1, token=TOKENS["other"], run_id=run_id)
    with sign_in(ops_base, OPS_TOKEN) as client:
        overview = client.get("/console")
        listed = client.get("/console/dead-letters", params={"run_id": run_id})
        run = client.get(f"/console/runs/{run_id}")
        done = client.post(
            "/console/dead-letters/redrive",
            data={"namespace": "other", "run_id": run_id, "csrf_token": csrf_of(listed.text)},
        )
    assert "operator alice" in overview.text
    for view in (mine, theirs):
        assert view["dead_letter"]["dead_letter_id"] in listed.text
        assert view["signal_id"] in run.text
    assert done.status_code == 303 and "count=1" in done.headers["location"]
    states = {
        ns: db_scalar(stack, "SELECT state FROM dead_letters WHERE namespace = %s", ns)
        for ns in ("default", "other")
    }
    assert states == {"default": "open", "other": "redriven"}
