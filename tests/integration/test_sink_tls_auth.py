"""The sink speaks what applications send (docs/api.md, "Your application's
mail settings"): STARTTLS, SMTPS and AUTH with Python's own smtplib, the
token rule across two namespaces, a TLS hello on the plain port, and the
refusals a dead letter names. The `required` modes: test_sink_required.py."""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
import uuid
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_rows, mail, wait_result
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def trusting(stack: Stack) -> ssl.SSLContext:
    """A client context that trusts the sink's self-signed certificate (and
    checks the host name against it)."""
    return ssl.create_default_context(cafile=str(cert_path(stack)))


def cert_path(stack: Stack) -> Path:
    return stack.data_dir / "smtp-tls" / "cert.pem"


def dead_letter(stack: Stack, view: dict) -> dict:
    assert view["status"] == "expired", view
    with stack.client() as api:
        response = api.get(f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_the_self_signed_certificate_is_made_once_with_a_private_key(stack: Stack) -> None:
    key = stack.data_dir / "smtp-tls" / "key.pem"
    assert cert_path(stack).exists() and key.exists()
    assert key.stat().st_mode & 0o777 == 0o600
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_path(stack).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_ehlo_offers_starttls_and_auth_and_after_starttls_auth_only(stack: Stack) -> None:
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        smtp.ehlo()
        assert smtp.has_extn("starttls")
        assert set(smtp.esmtp_features["auth"].split()) == {"PLAIN", "LOGIN"}
        smtp.starttls(context=trusting(stack))
        smtp.ehlo()
        assert not smtp.has_extn("starttls")
        assert smtp.has_extn("auth")


def test_starttls_and_login_with_the_namespace_token_delivers_mail_a_signal_finds(
    stack: Stack,
) -> None:
    signal = create_signal(stack)
    to = signal["recipient"]
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        smtp.starttls(context=trusting(stack))
        smtp.login("my-app", TOKENS["default"])
        smtp.sendmail("app@example.test", [to], mail(to))
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
    ((auth,),) = db_rows(stack, "SELECT auth_namespace FROM sink_messages")
    assert auth == "default"


def test_smtps_with_login_delivers_mail_a_signal_finds(stack: Stack) -> None:
    signal = create_signal(stack)
    to = signal["recipient"]
    with smtplib.SMTP_SSL(
        stack.smtp_host, stack.smtps_port, context=trusting(stack), timeout=30
    ) as smtp:
        assert not smtp.ehlo()[1].decode().count("STARTTLS")
        smtp.login("my-app", "any password will do")  # optional: accepted, no namespace
        smtp.sendmail("app@example.test", [to], mail(to))
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
    ((auth,),) = db_rows(stack, "SELECT auth_namespace FROM sink_messages")
    assert auth is None


def test_any_credentials_pass_in_optional_mode_and_none_reach_the_logs(stack: Stack) -> None:
    """AUTH PLAIN and LOGIN, with and without TLS: accepted; the password
    (here one that looks like nothing else in the logs) is never written."""
    secret = f"pw-{uuid.uuid4().hex}"
    signal = create_signal(stack)
    to = signal["recipient"]
    for mechanism, secure in (("PLAIN", False), ("LOGIN", True)):
        with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
            if secure:
                smtp.starttls(context=trusting(stack))
            smtp.ehlo()
            smtp.user, smtp.password = "someone", secret
            code, _ = smtp.auth(mechanism, getattr(smtp, f"auth_{mechanism.lower()}"))
            assert code == 235
            smtp.sendmail("app@example.test", [to], mail(to))
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
    assert secret not in stack.log_text()
    import base64

    assert base64.b64encode(secret.encode()).decode()[:16] not in stack.log_text()


def test_mail_sent_with_one_namespace_s_token_is_never_another_namespace_s(
    stack: Stack,
) -> None:
    """`default` holds the address (its signal); `other`'s application sends
    to it with `other`'s token: that message is `other`'s alone, so
    `default`'s signal never finds it (no match, no near miss), while the same
    mail sent with `default`'s token is found."""
    held = create_signal(stack, expires_in_seconds=4, subject_contains="Verify")
    to = held["recipient"]
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        smtp.login("app", TOKENS["other"])
        smtp.sendmail("app@example.test", [to], mail(to, subject="Verify nearly"))
        smtp.sendmail("app@example.test", [to], mail(to, subject="Something else"))
    view = wait_result(stack, held["signal_id"], wait=20)
    letter = dead_letter(stack, view)
    assert letter["near_misses"] == []
    rows = db_rows(stack, "SELECT auth_namespace FROM messages")
    assert rows and {r[0] for r in rows} == {"other"}

    found = create_signal(stack, recipient=to, subject_contains="Verify")
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        smtp.login("app", TOKENS["default"])
        smtp.sendmail("app@example.test", [to], mail(to, subject="Verify now"))
    assert wait_result(stack, found["signal_id"])["status"] == "found"


def _refused_count(stack: Stack, reason: str) -> float:
    with stack.client() as api:
        text = api.get("/metrics").text
    found = re.search(rf'signalbox_smtp_refused_total\{{reason="{reason}"\}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_a_tls_hello_on_the_plain_port_is_closed_with_one_line_naming_smtps_and_starttls(
    stack: Stack,
) -> None:
    before = _refused_count(stack, "tls_on_plain_port")

    def hello_lines() -> list[str]:
        return [ln for ln in stack.log_text("smtp").splitlines() if "tls_on_plain_port" in ln]

    earlier = len(hello_lines())
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with (
        socket.create_connection((stack.smtp_host, stack.smtp_port), timeout=10) as raw,
        pytest.raises((ssl.SSLError, ConnectionError, OSError)),
        context.wrap_socket(raw, server_hostname="localhost"),
    ):
        pass

    lines = wait_until(
        lambda: hello_lines()[earlier:],
        10,
        what="the log line",
    )
    assert len(lines) == 1
    assert str(stack.smtps_port) in lines[0] and "STARTTLS" in lines[0]
    assert "\\u0016" not in stack.log_text("smtp") and "\x16" not in stack.log_text("smtp")
    wait_until(lambda: _refused_count(stack, "tls_on_plain_port") == before + 1, 10, what="counted")


def test_a_message_over_the_size_limit_is_named_in_the_dead_letter(stack: Stack) -> None:
    """smtplib declares SIZE with MAIL FROM: the sink refuses each recipient
    with 552 (nothing of the 26 MiB is sent), and the expired signal's
    recommendation names that refused delivery, its time and the fix."""
    signal = create_signal(stack, expires_in_seconds=3)
    to = signal["recipient"]
    big = mail(to) + b"x" * (26 * 1024 * 1024)
    with (
        smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp,
        pytest.raises(smtplib.SMTPRecipientsRefused) as refused,
    ):
        smtp.sendmail("app@example.test", [to], big)
    ((code, text),) = refused.value.recipients.values()
    assert code == 552 and b"26 MiB > 25 MiB" in text
    letter = dead_letter(stack, wait_result(stack, signal["signal_id"], wait=20))
    sentence = letter["recommendation"]
    assert f"An SMTP client tried to deliver to {to} at " in sentence
    assert "552 message too large (26 MiB > 25 MiB)" in sentence
    assert "raise SIGNALBOX_SMTP_MAX_BYTES or send a smaller attachment" in sentence
    wait_until(lambda: _refused_count(stack, "message_too_large") >= 1, 10, what="counted")


def test_a_chaos_refusal_is_named_in_the_dead_letter(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=3)
    to = signal["recipient"]
    rule = {"recipient": to, "stage": "rcpt", "reply": "550 5.1.1 Mailbox unavailable"}
    with stack.client() as api:
        assert api.put("/v1/chaos", json={"rules": [{**rule, "times": 1}]}).status_code == 200
    with (
        smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp,
        pytest.raises(smtplib.SMTPRecipientsRefused),
    ):
        smtp.sendmail("app@example.test", [to], mail(to))
    sentence = dead_letter(stack, wait_result(stack, signal["signal_id"], wait=20))[
        "recommendation"
    ]
    assert f"tried to deliver to {to}" in sentence
    assert "550 Mailbox unavailable" in sentence and "chaos rule" in sentence


def test_refused_deliveries_are_kept_as_long_as_the_mail_they_explain(stack: Stack) -> None:
    from tests.integration.test_retention import run_retention

    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        smtp.ehlo()
        smtp.mail("app@example.test", options=[f"SIZE={30 * 1024 * 1024}"])
        assert smtp.rcpt("old@example.test")[0] == 552
        assert smtp.rcpt("new@example.test")[0] == 552
    rows = wait_until(
        lambda: len(r := db_rows(stack, "SELECT recipients FROM smtp_refusals")) == 2 and r,
        10,
        what="both refusals recorded",
    )
    assert sorted(r[0] for r in rows) == [["new@example.test"], ["old@example.test"]]
    hours = int(float(stack.env.get("SIGNALBOX_RETENTION_HOURS", "72"))) + 1
    db_rows(
        stack,
        "UPDATE smtp_refusals SET refused_at = now() - make_interval(hours => %s)"
        " WHERE 'old@example.test' = ANY(recipients)",
        hours,
    )
    run_retention(stack)
    left = db_rows(stack, "SELECT recipients FROM smtp_refusals")
    assert left == [(["new@example.test"],)]
