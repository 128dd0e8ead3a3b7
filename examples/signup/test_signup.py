"""Signup end to end: the verification email is waited for, claimed, followed, consumed.

Needs a running Signalbox (``make run``) and ``SIGNALBOX_TOKEN``; see README.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from signalbox import Signalbox

# pytest puts this directory (not a package) on sys.path.
from signup_app import SUBJECT, SignupApp


@pytest.fixture(scope="module")
def signup_app() -> Iterator[SignupApp]:
    app = SignupApp().start()
    yield app
    app.stop()


@pytest.mark.signalbox(expires_in_seconds=60, require_run_marker=True)
def test_signup_email_link_verifies_the_account(
    signup_app: SignupApp, signalbox: Signalbox, signalbox_watch, signalbox_run_id: str
) -> None:
    # A fresh mailbox: no earlier email (or another run's) can be mistaken for ours.
    mailbox = signalbox.mailbox(signalbox_run_id)
    # Watch before acting, so the window opens before the email can arrive.
    handle = signalbox_watch(mailbox.address, subject_contains=SUBJECT)

    signup = httpx.post(
        f"{signup_app.base_url}/signup",
        json={"email": mailbox.address},
        headers={"X-Signalbox-Run": signalbox_run_id},
    )
    assert signup.status_code == 201, signup.text

    handle.wait(timeout=60)
    lease = handle.claim()
    with lease as claim:
        # The email is untrusted input: follow only a link that points at our own app.
        link = next(u for u in claim.links if u.startswith(f"{signup_app.base_url}/verify?"))
        assert httpx.get(link).status_code == 200

    assert lease.receipt is not None and lease.receipt.run_id == signalbox_run_id
    state = httpx.get(f"{signup_app.base_url}/users", params={"email": mailbox.address})
    assert state.json()["verified"] is True


@pytest.mark.signalbox(expires_in_seconds=60, require_run_marker=True)
def test_signup_retries_when_the_mail_server_says_try_again_later(
    signup_app: SignupApp, signalbox: Signalbox, signalbox_watch, signalbox_run_id: str
) -> None:
    mailbox = signalbox.mailbox(signalbox_run_id)
    # Signalbox's sink answers this address's first two RCPT TO with a 451.
    api = httpx.Client(
        base_url=signalbox.url, headers={"Authorization": f"Bearer {signalbox.token}"}
    )
    rule = {"recipient": mailbox.address, "stage": "rcpt", "reply": "451 4.3.0 Try again later"}
    chaos = api.put("/v1/chaos", json={"rules": [{**rule, "times": 2}]})
    assert chaos.status_code == 200, chaos.text
    try:
        handle = signalbox_watch(mailbox.address, subject_contains=SUBJECT)
        sent_before = len(signup_app.send_log)
        signup = httpx.post(
            f"{signup_app.base_url}/signup",
            json={"email": mailbox.address},
            headers={"X-Signalbox-Run": signalbox_run_id},
        )
        assert signup.status_code == 201, signup.text

        # Refused twice, delivered on the third try: the application retried.
        assert signup_app.send_log[sent_before:] == ["451", "451", "sent"]
        handle.wait(timeout=60)
        with handle.claim() as claim:
            assert any(u.startswith(f"{signup_app.base_url}/verify?") for u in claim.links)
        (applied,) = api.get("/v1/chaos").json()["rules"]
        assert applied["applied"] == 2
    finally:
        api.delete("/v1/chaos")
        api.close()
