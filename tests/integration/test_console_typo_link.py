"""The console's near-miss link of a `recipient_typo` opens the mis-addressed
message (the one a developer opens to see the typo); no other namespace's
console does."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.helpers import mail
from tests.integration.test_diagnosis import create, dead_letter_of
from tests.integration.test_triage_console import sign_in
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


def test_the_typo_near_miss_link_opens_the_mis_addressed_message(stack: Stack) -> None:
    domain = f"d{uuid.uuid4().hex[:6]}.test"
    signal = create(stack, recipient=f"new-user@{domain}", subject_contains="Verify")
    typo = f"new-usre@{domain}"
    stack.send(mail(typo, subject="Verify your account (typo)", run=signal["run_id"]), [typo])
    dl = dead_letter_of(stack, signal["signal_id"])
    (near,) = dl["near_misses"]
    assert near["why"] == "recipient_typo"
    link = f"/console/messages/{near['message_id']}"

    with sign_in(stack.api_url, TOKENS["default"]) as console:
        listed = console.get(f"/console/dead-letters/{dl['dead_letter_id']}")
        assert f'href="{link}"' in listed.text
        page = console.get(link)
    assert page.status_code == 200, page.text[:500]
    assert "Verify your account (typo)" in page.text
    assert typo in page.text

    with sign_in(stack.api_url, TOKENS["other"]) as other:
        assert other.get(link).status_code == 404
