"""Applications' own mail clients against the sink, with the settings staging
environments carry (docs/api.md, "Your application's mail settings"):
Django's SMTP `EmailBackend` (EMAIL_USE_TLS, EMAIL_USE_SSL, credentials) and
nodemailer (secure, requireTLS, auth), each delivering mail a signal finds;
and both refused as they must be by a sink whose TLS and AUTH are required."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import create_signal, wait_result
from tests.stack import ROOT, TOKENS, Stack
from tests.stack_fixtures import PgServer, session_stack

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "playwright-signup"


@pytest.fixture(scope="module")
def required_stack(
    pg_server: PgServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A sink that requires STARTTLS (or SMTPS) and AUTH with a namespace token."""
    env = {"SIGNALBOX_SMTP_TLS": "required", "SIGNALBOX_SMTP_AUTH": "required"}
    with session_stack(pg_server, redis_url, tmp_path_factory.mktemp("req"), 12, env) as stack:
        yield stack


def cert(stack: Stack) -> Path:
    return stack.data_dir / "smtp-tls" / "cert.pem"


# ------------------------------------------------------------------ Django


def django_send(stack: Stack, to: str, monkeypatch: pytest.MonkeyPatch, **backend: Any) -> int:
    """Send one message with Django's SMTP EmailBackend configured by
    `backend` (host, port, username, password, use_tls, use_ssl), trusting
    the sink's self-signed certificate the way docs/api.md says (SSL_CERT_FILE)."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(DEFAULT_FROM_EMAIL="app@example.test")
    from django.core.mail import EmailMessage, get_connection

    monkeypatch.setenv("SSL_CERT_FILE", str(cert(stack)))
    connection = get_connection(
        "django.core.mail.backends.smtp.EmailBackend",
        host=stack.smtp_host,
        fail_silently=False,
        timeout=30,
        **backend,
    )
    message = EmailMessage("Verify your account", "Your code is 493817", to=[to])
    try:
        return int(connection.send_messages([message]) or 0)
    finally:
        # Django leaves the socket open when a refusal raises out of open().
        connection.close()


@pytest.mark.parametrize(
    ("mode", "port_of"),
    [
        ("credentials", "smtp_port"),  # EMAIL_HOST_USER/PASSWORD, no TLS
        ("use_tls", "smtp_port"),  # EMAIL_USE_TLS: STARTTLS
        ("use_ssl", "smtps_port"),  # EMAIL_USE_SSL: implicit TLS
    ],
)
def test_django_email_backend_with_staging_settings_delivers_mail_a_signal_finds(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, mode: str, port_of: str
) -> None:
    signal = create_signal(stack)
    sent = django_send(
        stack,
        signal["recipient"],
        monkeypatch,
        port=getattr(stack, port_of),
        username="signup-app",
        password=TOKENS["default"],
        use_tls=mode == "use_tls",
        use_ssl=mode == "use_ssl",
    )
    assert sent == 1
    assert wait_result(stack, signal["signal_id"])["status"] == "found"


def test_django_without_tls_or_credentials_is_refused_where_both_are_required(
    required_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    import smtplib

    to = f"user-{uuid.uuid4().hex[:6]}@example.test"
    with pytest.raises(smtplib.SMTPSenderRefused) as refused:
        django_send(required_stack, to, monkeypatch, port=required_stack.smtp_port)
    assert refused.value.smtp_code == 530
    assert b"STARTTLS" in refused.value.smtp_error
    with pytest.raises(smtplib.SMTPSenderRefused) as refused:
        django_send(required_stack, to, monkeypatch, port=required_stack.smtp_port, use_tls=True)
    assert (refused.value.smtp_code, refused.value.smtp_error) == (
        530,
        b"5.7.0 Authentication required",
    )
    with pytest.raises(smtplib.SMTPAuthenticationError) as failed:
        django_send(
            required_stack,
            to,
            monkeypatch,
            port=required_stack.smtps_port,
            use_ssl=True,
            username="app",
            password="not-a-token",
        )
    assert failed.value.smtp_code == 535
    signal = create_signal(required_stack)
    sent = django_send(
        required_stack,
        signal["recipient"],
        monkeypatch,
        port=required_stack.smtps_port,
        use_ssl=True,
        username="app",
        password=TOKENS["default"],
    )
    assert sent == 1
    assert wait_result(required_stack, signal["signal_id"])["status"] == "found"


# ------------------------------------------------------------------ nodemailer


@pytest.fixture(scope="module")
def node_deps() -> None:
    from tests.clients.test_typescript import run

    run(["bash", str(ROOT / "scripts" / "install-node-deps.sh")], ROOT, timeout=600)


def nodemailer_send(options: dict[str, Any], to: str) -> dict[str, Any]:
    message = {
        "from": "app@example.test",
        "to": to,
        "subject": "Verify your account",
        "text": "Your code is 493817",
    }
    proc = subprocess.run(
        ["node", "send-with-nodemailer.mjs", json.dumps(options), json.dumps(message)],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("mode", ["secure", "requireTLS", "auth"])
def test_nodemailer_with_secure_require_tls_and_auth_delivers_mail_a_signal_finds(
    node_deps: None, stack: Stack, mode: str
) -> None:
    signal = create_signal(stack)
    options: dict[str, Any] = {"host": stack.smtp_host, "port": stack.smtp_port}
    tls = {"caFile": str(cert(stack)), "servername": "localhost"}
    if mode == "secure":
        options.update(port=stack.smtps_port, secure=True, tls=tls)
    elif mode == "requireTLS":
        options.update(requireTLS=True, tls=tls)
    else:  # credentials, without TLS
        options.update(ignoreTLS=True, auth={"user": "app", "pass": TOKENS["default"]})
    if mode != "auth":
        options["auth"] = {"user": "app", "pass": TOKENS["default"]}
    result = nodemailer_send(options, signal["recipient"])
    assert result["ok"], result
    assert wait_result(stack, signal["signal_id"])["status"] == "found"


def test_nodemailer_is_refused_where_tls_and_auth_are_required(
    node_deps: None, required_stack: Stack
) -> None:
    to = f"user-{uuid.uuid4().hex[:6]}@example.test"
    base = {"host": required_stack.smtp_host, "port": required_stack.smtp_port}
    plain = nodemailer_send({**base, "ignoreTLS": True}, to)
    assert not plain["ok"] and plain["responseCode"] == 530, plain
    tls = {"caFile": str(cert(required_stack)), "servername": "localhost"}
    no_auth = nodemailer_send({**base, "requireTLS": True, "tls": tls}, to)
    assert not no_auth["ok"] and no_auth["responseCode"] == 530, no_auth
    bad = nodemailer_send(
        {**base, "requireTLS": True, "tls": tls, "auth": {"user": "a", "pass": "nope"}}, to
    )
    assert not bad["ok"] and bad["responseCode"] == 535, bad
