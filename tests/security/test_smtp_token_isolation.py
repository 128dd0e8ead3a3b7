"""The SMTP token rule (§12.1) between two tenants: mail a sender
authenticated for with team-b's API token is team-b's alone, even when it
is delivered to an address team-a owns; every path that shows mail follows
it (matches, near misses, typos, `messages_seen`)."""

from __future__ import annotations

import smtplib
import uuid

import pytest

from tests.security.conftest import TOKEN_A, TOKEN_B
from tests.security.test_isolation import (
    SECRET_CODE,
    client,
    create,
    ended,
    messages_seen,
    secret_mail,
)
from tests.stack import Stack

pytestmark = pytest.mark.integration


def send_as(stack: Stack, token: str, raw: bytes, to: list[str]) -> None:
    """Send like an application whose SMTP password is `token` (smtplib's login)."""
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp:
        smtp.login("my-app", token)
        smtp.sendmail("app@example.test", to, raw)


def test_mail_sent_with_team_b_s_token_to_team_a_s_address_is_never_team_a_s(
    tenancy_stack: Stack,
) -> None:
    stack = tenancy_stack
    owned = f"new-user-{uuid.uuid4().hex[:6]}@team-a.test"
    typo = owned.replace("new-user", "new-usr")
    with client(stack, TOKEN_A) as a:
        sig = create(a, recipient=owned, expires_in_seconds=4, subject_contains="Reset")
        # A near miss (other subject) and a recipient typo, also with B's token.
        send_as(stack, TOKEN_B, secret_mail(owned), [owned])
        send_as(stack, TOKEN_B, secret_mail(owned, subject="Other"), [owned])
        send_as(stack, TOKEN_B, secret_mail(typo), [typo])
        view = ended(a, sig["signal_id"])
        assert view["status"] == "expired", view
        dead = a.get(f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}").json()
        assert dead["near_misses"] == [], dead
        assert SECRET_CODE not in str(view) + str(dead)
        assert messages_seen(stack, sig["signal_id"]) == 0

        # A's own application, with A's token: found.
        found = create(a, recipient=owned, subject_contains="Reset")
        send_as(stack, TOKEN_A, secret_mail(owned), [owned])
        assert ended(a, found["signal_id"])["status"] == "found"
