"""The console's session against a hostile client: sign-out ends the session
on every replica (a replayed cookie is refused), sign-in guessing is
throttled per address, odd cookie and CSRF values are refused (never a 500),
and cookies are `Secure` with HSTS unless the API binds loopback."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

import httpx
import pytest

from app.settings import load_settings
from app.usecases import auth
from tests.security.rawhttp import request
from tests.servers import free_port
from tests.stack import TOKENS, Stack

COOKIE = "signalbox_console"
LOGIN_COOKIE = "signalbox_console_login"


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html
    return found.group(1)


# A tenant lands on its inbox, an operator on the overview.
LANDINGS = ("/console/inbox", "/console")


def sign_in(client: httpx.Client, token: str, headers: dict[str, str] | None = None) -> str:
    """Sign `client` in with `token`; the CSRF token of its session."""
    csrf = csrf_of(client.get("/console/login", headers=headers).text)
    done = client.post("/console/login", data={"token": token, "csrf_token": csrf}, headers=headers)
    assert done.status_code == 303 and done.headers["location"] in LANDINGS, done.text
    return csrf_of(client.get("/console").text)


def from_address() -> dict[str, str]:
    n = uuid.uuid4().int
    return {"X-Forwarded-For": f"2001:db8:1::{n % 65536:x}:{(n >> 16) % 65536:x}"}


# ------------------------------------------------------------ sign-out


@pytest.mark.integration
def test_a_signed_out_cookie_replayed_is_refused(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        csrf = sign_in(client, TOKENS["default"])
        kept = client.cookies[COOKIE]
        out = client.post("/console/logout", data={"csrf_token": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/console/login"
    with httpx.Client(base_url=stack.api_url, timeout=30) as replay:
        replay.cookies.set(COOKIE, kept, path="/console")
        page = replay.get("/console")
        assert page.status_code == 303 and page.headers["location"] == "/console/login"


@pytest.mark.integration
def test_sign_out_on_one_replica_is_refused_by_another(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory({"SIGNALBOX_CONSOLE_SECRET": "shared-" + uuid.uuid4().hex})
    stack.start_api()
    second_port = free_port()
    stack.spawn("api-2", ["api"], {"SIGNALBOX_API_PORT": str(second_port)})
    second = f"http://127.0.0.1:{second_port}"
    stack.wait_for(
        "the second API",
        lambda: _answers(second),
        120,
        process="api-2",
    )
    with httpx.Client(base_url=stack.api_url, timeout=30) as first:
        csrf = sign_in(first, TOKENS["default"])
        kept = first.cookies[COOKIE]
        with httpx.Client(base_url=second, timeout=30) as other:
            other.cookies.set(COOKIE, kept, path="/console")
            assert other.get("/console").status_code == 200  # one session, both replicas
            assert first.post("/console/logout", data={"csrf_token": csrf}).status_code == 303
            page = other.get("/console")
            assert page.status_code == 303 and page.headers["location"] == "/console/login"


def _answers(base: str) -> bool:
    try:
        return httpx.get(base + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ------------------------------------------------------------ sign-in guessing


@pytest.mark.integration
def test_sign_in_gets_429_after_20_wrong_tokens_from_one_address(stack: Stack) -> None:
    address = from_address()
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        csrf = csrf_of(client.get("/console/login", headers=address).text)
        for _ in range(auth.FAILURES_PER_WINDOW):
            wrong = client.post(
                "/console/login", data={"token": "guess", "csrf_token": csrf}, headers=address
            )
            assert wrong.status_code == 401
        refused = client.post(
            "/console/login", data={"token": "guess", "csrf_token": csrf}, headers=address
        )
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert COOKIE not in refused.cookies
        # The right token still signs in from that address.
        sign_in(client, TOKENS["default"], headers=address)


# ------------------------------------------------------------ odd values


@pytest.mark.integration
@pytest.mark.parametrize(
    "cookie",
    [
        "\xe9t\xe9.\xe9",  # not ASCII (latin-1 on the wire)
        "eyJrIjoib3BzIn0.\xff\xfe",  # an ASCII body, a non-ASCII MAC
        "no-dot-at-all",
        "." * 5000,
        "!!!.0000",
    ],
)
def test_a_malformed_session_cookie_redirects_to_sign_in(stack: Stack, cookie: str) -> None:
    answer = request(
        stack.api_port,
        "GET",
        "/console",
        headers={"Cookie": f"{COOKIE}={cookie}"},  # sent as UTF-8 bytes
    )
    assert answer.status == 303
    assert answer.headers["location"] == "/console/login"


@pytest.mark.integration
def test_a_non_ascii_csrf_value_is_403_not_500(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        sign_in(client, TOKENS["default"])
        out = client.post("/console/logout", data={"csrf_token": "caf\u00e9\u2603"})
        assert out.status_code == 403
        assert client.get("/console").status_code == 200  # still signed in


@pytest.mark.integration
def test_a_non_ascii_login_cookie_or_csrf_value_is_403_not_500(stack: Stack) -> None:
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        csrf = csrf_of(client.get("/console/login").text)
        r = client.post("/console/login", data={"token": "x", "csrf_token": "\u2603" + csrf})
        assert r.status_code == 403
    answer = request(
        stack.api_port,
        "POST",
        "/console/login",
        headers={
            "Cookie": f"{LOGIN_COOKIE}=\xe9\xe9",
            "Content-Type": "application/x-www-form-urlencoded",
            "Content-Length": "25",
            "Connection": "close",
        },
        body=[b"token=x&csrf_token=%C3%A9"],
    )
    assert answer.status == 403


# ------------------------------------------------------------ Secure cookies


@pytest.mark.integration
def test_cookies_are_secure_with_hsts_when_the_api_binds_beyond_loopback(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory({"SIGNALBOX_API_HOST": "0.0.0.0"})
    stack.start_api()
    page = httpx.get(stack.api_url + "/console/login", timeout=30)
    assert "secure" in page.headers["set-cookie"].lower()
    assert page.headers["strict-transport-security"] == "max-age=31536000"
    assert "strict-transport-security" not in httpx.get(stack.api_url + "/healthz").headers


@pytest.mark.integration
def test_cookies_are_not_secure_without_hsts_on_loopback(stack: Stack) -> None:
    page = httpx.get(stack.api_url + "/console/login", timeout=30)
    assert "secure" not in page.headers["set-cookie"].lower()
    assert "strict-transport-security" not in page.headers


@pytest.mark.parametrize(
    ("host", "override", "secure"),
    [
        ("127.0.0.1", None, False),
        ("127.0.0.2", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", None, True),
        ("10.1.2.3", None, True),
        ("api.internal", None, True),
        ("0.0.0.0", False, False),
        ("127.0.0.1", True, True),
    ],
)
def test_secure_cookies_follow_the_bind_address_unless_overridden(
    host: str, override: bool | None, secure: bool
) -> None:
    settings = load_settings(api_host=host, console_secure_cookies=override)
    assert settings.console_cookies_secure is secure
