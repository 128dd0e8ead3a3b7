"""A sink that requires STARTTLS and AUTH with a namespace token, accepts
only example.test and two recipients per message: what it refuses, with
Python's smtplib, and each refusal named in the dead letter of the signal
whose mail it was (docs/api.md, "Refused deliveries")."""

from __future__ import annotations

import smtplib
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.helpers import create_signal, mail, wait_result
from tests.stack import TOKENS, Stack
from tests.stack_fixtures import PgServer, session_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def strict(
    pg_server: PgServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    env = {
        "SIGNALBOX_SMTP_TLS": "required",
        "SIGNALBOX_SMTP_AUTH": "required",
        "SIGNALBOX_SMTP_DOMAINS": "example.test",
        "SIGNALBOX_SMTP_MAX_RECIPIENTS": "2",
    }
    with session_stack(pg_server, redis_url, tmp_path_factory.mktemp("strict"), 13, env) as stack:
        yield stack


def tls(stack: Stack) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(stack.data_dir / "smtp-tls" / "cert.pem"))


def secured(stack: Stack, token: str | None = TOKENS["default"]) -> smtplib.SMTP:
    smtp = smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30)
    smtp.starttls(context=tls(stack))
    smtp.ehlo()
    if token is not None:
        smtp.login("app", token)
    return smtp


def recommendation(stack: Stack, signal: dict[str, Any]) -> str:
    view = wait_result(stack, signal["signal_id"], wait=20)
    assert view["status"] == "expired", view
    with stack.client() as api:
        letter = api.get(f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}").json()
    return str(letter["recommendation"])


def test_mail_before_starttls_is_refused_and_named(strict: Stack) -> None:
    signal = create_signal(strict, expires_in_seconds=3)
    with smtplib.SMTP(strict.smtp_host, strict.smtp_port, timeout=30) as smtp:
        smtp.ehlo()
        assert smtp.has_extn("starttls")
        code, reply = smtp.mail("app@example.test")
        assert (code, reply) == (530, b"5.7.0 Must issue a STARTTLS command first")
    sentence = recommendation(strict, signal)
    assert "refused before it named its recipients: 530 Must issue a STARTTLS" in sentence
    assert "turn on STARTTLS" in sentence


def test_mail_without_auth_is_refused_and_named(strict: Stack) -> None:
    signal = create_signal(strict, expires_in_seconds=3)
    with secured(strict, token=None) as smtp:
        code, reply = smtp.mail("app@example.test")
        assert (code, reply) == (530, b"5.7.0 Authentication required")
        # A client that goes on anyway names its recipient: the refusal is its.
        code, _ = smtp.rcpt(signal["recipient"])
        assert code == 530
    sentence = recommendation(strict, signal)
    assert f"tried to deliver to {signal['recipient']}" in sentence
    assert "530 Authentication required" in sentence and "SMTP credentials" in sentence


def test_a_password_that_is_no_token_gets_535_and_is_named(strict: Stack) -> None:
    signal = create_signal(strict, expires_in_seconds=3)
    with secured(strict, token=None) as smtp, pytest.raises(smtplib.SMTPAuthenticationError) as err:
        smtp.login("app", "not-a-token")
    assert (err.value.smtp_code, err.value.smtp_error) == (
        535,
        b"5.7.8 Authentication credentials invalid",
    )
    sentence = recommendation(strict, signal)
    assert "535 Authentication credentials invalid" in sentence
    assert "API token as the SMTP password" in sentence


def test_a_recipient_outside_the_accepted_domains_is_named(strict: Stack) -> None:
    to = "new-user@elsewhere.test"
    signal = create_signal(strict, recipient=to, expires_in_seconds=3)
    with secured(strict) as smtp, pytest.raises(smtplib.SMTPRecipientsRefused):
        smtp.sendmail("app@example.test", [to], mail(to))
    sentence = recommendation(strict, signal)
    assert f"tried to deliver to {to}" in sentence
    assert "550 recipient domain elsewhere.test not accepted here" in sentence
    assert "SIGNALBOX_SMTP_DOMAINS" in sentence


def test_a_recipient_past_the_limit_is_named(strict: Stack) -> None:
    signal = create_signal(strict, expires_in_seconds=3)
    others = ["a@example.test", "b@example.test"]
    with secured(strict) as smtp:
        smtp.mail("app@example.test")
        assert [smtp.rcpt(r)[0] for r in [*others, signal["recipient"]]] == [250, 250, 452]
        smtp.rset()
    assert "452 Too many recipients" in recommendation(strict, signal)


def test_a_line_too_long_is_named(strict: Stack) -> None:
    signal = create_signal(strict, expires_in_seconds=3)
    to = signal["recipient"]
    raw = mail(to).replace(b"Your code", b"x" * 2000 + b" Your code")
    with secured(strict) as smtp, pytest.raises(smtplib.SMTPDataError) as err:
        smtp.sendmail("app@example.test", [to], raw)
    assert err.value.smtp_code == 500
    sentence = recommendation(strict, signal)
    assert f"tried to deliver to {to}" in sentence and "500 Line too long" in sentence


def test_with_starttls_and_a_token_mail_is_found(strict: Stack) -> None:
    signal = create_signal(strict)
    to = signal["recipient"]
    with secured(strict) as smtp:
        smtp.sendmail("app@example.test", [to], mail(to))
    assert wait_result(strict, signal["signal_id"])["status"] == "found"


def test_failed_logins_are_throttled_like_http_sign_ins(strict: Stack) -> None:
    """After 20 failures in a minute from one address the next AUTH gets 421
    and the connection is closed (counted in Redis, as the API counts them)."""
    codes = []
    with secured(strict, token=None) as smtp:
        smtp.user, smtp.password = "app", "wrong"
        for _ in range(21):
            try:
                smtp.auth("PLAIN", smtp.auth_plain)
            except smtplib.SMTPAuthenticationError as exc:
                codes.append(exc.smtp_code)
                if exc.smtp_code == 421:
                    break
    # Earlier failures from this address in the last minute count too.
    assert set(codes[:-1]) == {535} and len(codes) <= 21, codes
    assert codes[-1] == 421, codes
