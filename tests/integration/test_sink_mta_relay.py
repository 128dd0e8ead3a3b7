"""Mail relayed by a real MTA: Debian's Postfix, on its own configuration,
queue and loopback port, relaying everything to the sink with mandatory
STARTTLS (`smtp_tls_security_level = encrypt`) and SASL credentials (a
namespace's API token as the password); a signal finds the message, and the
sink knows it as that namespace's."""

from __future__ import annotations

import smtplib

import pytest

from tests.integration.helpers import create_signal, db_rows, mail, wait_result
from tests.servers.postfix import postfix_relay
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


def test_postfix_relaying_with_starttls_and_sasl_delivers_mail_a_signal_finds(
    stack: Stack,
) -> None:
    signal = create_signal(stack)
    to = signal["recipient"]
    with postfix_relay(
        next_hop_port=stack.smtp_port,
        username="relay",
        password=TOKENS["default"],
        ca_file=stack.data_dir / "smtp-tls" / "cert.pem",
    ) as relay:
        with smtplib.SMTP(relay.host, relay.port, timeout=30) as smtp:
            smtp.sendmail("app@example.test", [to], mail(to))
        view = wait_result(stack, signal["signal_id"], wait=60)
        log = relay.log_path.read_text() if relay.log_path.exists() else ""
    assert view["status"] == "found", log
    assert "TLS connection established" in log, log
    assert "status=sent" in log, log
    ((auth,),) = db_rows(stack, "SELECT auth_namespace FROM sink_messages")
    assert auth == "default"
