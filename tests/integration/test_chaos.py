"""Chaos on the sink over real sockets: a namespace's rules make the SMTP sink
refuse RCPT TO or DATA for its own addresses, counted across sink processes,
for a number of times or with a probability, until they end."""

from __future__ import annotations

import smtplib
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from tests.integration.helpers import db_scalar, mail, wait_result
from tests.servers import free_port, port_open
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration

REPLY = "451 4.3.0 Try again later"


@pytest.fixture
def owned_stack(stack_factory: Callable[..., Stack]) -> Stack:
    """A stack of its own where `default` owns chaos.test and `other` other.test,
    and rules last at most 600 s."""
    stack = stack_factory(
        {
            "SIGNALBOX_NAMESPACE_DOMAINS": "default:chaos.test,other:other.test",
            "SIGNALBOX_CHAOS_MAX_SECONDS": "600",
        }
    )
    return stack.start(worker=False, beat=False)


@pytest.fixture
def chaos_stack(stack: Stack) -> Stack:
    """The shared stack (no owned domains); rules last at most 3600 s."""
    return stack


def address(domain: str = "chaos.test") -> str:
    return f"user-{uuid.uuid4().hex[:8]}@{domain}"


def put_rules(stack: Stack, rules: list[dict[str, Any]], token: str | None = None) -> Any:
    with stack.client(token) as api:
        return api.put("/v1/chaos", json={"rules": rules})


def stored_for(stack: Stack, to: str) -> int:
    return int(
        db_scalar(stack, "SELECT count(*) FROM sink_messages WHERE %s = ANY(all_recipients)", to)
    )


def send_with_retries(
    stack: Stack, raw: bytes, to: str, *, attempts: int = 5, refusals: list[str] | None = None
) -> int:
    """Send like an application that retries a temporary failure (4xx at
    RCPT TO or DATA) on a new connection; returns the attempt that delivered
    (0: none did), each refusal's reply appended to `refusals`."""
    for attempt in range(1, attempts + 1):
        try:
            with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp:
                smtp.sendmail("app@example.test", [to], raw)
            return attempt
        except smtplib.SMTPRecipientsRefused as exc:
            ((code, text),) = exc.recipients.values()
            assert 400 <= code < 500, exc.recipients
            if refusals is not None:
                refusals.append(f"{code} {text.decode()}")
        except smtplib.SMTPDataError as exc:
            assert 400 <= exc.smtp_code < 500, exc
    return 0


def test_a_451_twice_then_the_third_try_is_delivered_and_found(chaos_stack: Stack) -> None:
    to = address()
    put = put_rules(chaos_stack, [{"recipient": to, "stage": "rcpt", "reply": REPLY, "times": 2}])
    assert put.status_code == 200, put.text
    (rule,) = put.json()["rules"]
    assert rule["applied"] == 0 and rule["times"] == 2 and rule["recipient"] == to

    with chaos_stack.client() as api:
        signal = api.post(
            "/v1/signals", json={"run_id": "run-chaos", "test_case": "retry", "recipient": to}
        ).json()
    refusals: list[str] = []
    assert send_with_retries(chaos_stack, mail(to, run="run-chaos"), to, refusals=refusals) == 3
    assert refusals == [REPLY, REPLY]
    assert stored_for(chaos_stack, to) == 1
    assert wait_result(chaos_stack, signal["signal_id"])["status"] == "found"
    with chaos_stack.client() as api:
        (after,) = api.get("/v1/chaos").json()["rules"]
    assert after["applied"] == 2


def test_a_data_rule_refuses_the_message_and_stores_nothing(chaos_stack: Stack) -> None:
    to = address()
    rule = {"recipient": to, "stage": "data", "reply": "554 5.7.0 Rejected by chaos", "times": 1}
    assert put_rules(chaos_stack, [rule]).status_code == 200
    with (
        pytest.raises(smtplib.SMTPDataError) as refused,
        smtplib.SMTP(chaos_stack.smtp_host, chaos_stack.smtp_port, timeout=60) as smtp,
    ):
        smtp.sendmail("app@example.test", [to], mail(to))
    assert refused.value.smtp_code == 554
    assert stored_for(chaos_stack, to) == 0
    chaos_stack.send(mail(to), [to])  # its one time is used up
    assert stored_for(chaos_stack, to) == 1


def test_a_domain_rule_covers_an_owned_domain_and_no_other_domain_may_be_named(
    owned_stack: Stack,
) -> None:
    for recipient in (address("other.test"), "*@other.test", "*@nobody-owns.test"):
        answer = put_rules(
            owned_stack, [{"recipient": recipient, "stage": "rcpt", "reply": REPLY, "times": 1}]
        )
        assert answer.status_code == 403, (recipient, answer.text)
        assert answer.json()["error"]["code"] == "recipient_not_owned"
    rule = {"recipient": "*@chaos.test", "stage": "rcpt", "reply": "450 Mailbox busy", "times": 2}
    answer = put_rules(owned_stack, [rule])
    assert answer.status_code == 200, answer.text
    assert answer.json()["rules"][0]["recipient"] == "*@chaos.test"
    first, second = address(), address()
    assert send_with_retries(owned_stack, mail(first), first) == 3
    assert send_with_retries(owned_stack, mail(second), second) == 1
    other = address("other.test")
    assert send_with_retries(owned_stack, mail(other), other, attempts=1) == 1
    # The other namespace sees its own rules only.
    with owned_stack.client(TOKENS["other"]) as api:
        assert api.get("/v1/chaos").json()["rules"] == []
    # The longest a rule lives is the setting.
    capped = put_rules(owned_stack, [{**rule, "expires_in_seconds": 99999}]).json()["rules"][0]
    lifetime = datetime.fromisoformat(capped["expires_at"]) - datetime.fromisoformat(
        capped["created_at"]
    )
    assert 599 <= lifetime.total_seconds() <= 601


def test_a_data_rule_never_refuses_another_tenants_recipients_in_one_transaction(
    owned_stack: Stack,
) -> None:
    """`default`'s DATA rule on its own addresses: a transaction to its
    addresses alone is refused at DATA; one that also carries `other`'s
    recipient is not: the rule acts at RCPT for its own recipient (after the
    other's) or keeps the mail from it (before), and `other` gets its mail."""
    reply = "554 5.7.0 Rejected by chaos"
    rule = {"recipient": "*@chaos.test", "stage": "data", "reply": reply, "times": 10}
    assert put_rules(owned_stack, [rule]).status_code == 200
    mine, theirs = address(), address("other.test")
    # The other tenant's recipient first: the rule answers this RCPT.
    with smtplib.SMTP(owned_stack.smtp_host, owned_stack.smtp_port, timeout=60) as smtp:
        refused = smtp.sendmail("app@example.test", [theirs, mine], mail(theirs))
    assert {k: (c, t.decode()) for k, (c, t) in refused.items()} == {
        mine: (554, "5.7.0 Rejected by chaos")
    }
    assert stored_for(owned_stack, theirs) == 1
    assert (
        db_scalar(
            owned_stack,
            "SELECT count(*) FROM sink_messages WHERE %s = ANY(envelope_recipients)",
            mine,
        )
        == 0
    )
    # Its own recipient first: delivered to the other tenant's alone.
    mine2, theirs2 = address(), address("other.test")
    with smtplib.SMTP(owned_stack.smtp_host, owned_stack.smtp_port, timeout=60) as smtp:
        assert smtp.sendmail("app@example.test", [mine2, theirs2], mail(theirs2)) == {}
    assert stored_for(owned_stack, theirs2) == 1
    assert stored_for(owned_stack, mine2) == 0
    # Its own addresses alone: refused at DATA, nothing stored (the control).
    mine3 = address()
    with (
        pytest.raises(smtplib.SMTPDataError) as data_refused,
        smtplib.SMTP(owned_stack.smtp_host, owned_stack.smtp_port, timeout=60) as smtp,
    ):
        smtp.sendmail("app@example.test", [mine3], mail(mine3))
    assert data_refused.value.smtp_code == 554
    assert stored_for(owned_stack, mine3) == 0
    with owned_stack.client() as api:
        (after,) = api.get("/v1/chaos").json()["rules"]
    assert after["applied"] == 3


def test_times_hold_across_two_sink_processes_sending_at_once(chaos_stack: Stack) -> None:
    port = free_port()
    chaos_stack.spawn(
        "smtp2", ["smtp"], extra_env={"SIGNALBOX_SMTP_PORT": str(port), "SIGNALBOX_SMTPS_PORT": "0"}
    )
    wait_until(lambda: port_open(port), 60, what="second sink")
    to = address()
    rule = {"recipient": to, "stage": "rcpt", "reply": REPLY, "times": 5}
    assert put_rules(chaos_stack, [rule]).status_code == 200
    refused: list[int] = []
    lock = threading.Lock()

    def sender(port: int) -> None:
        for _ in range(10):
            with smtplib.SMTP(chaos_stack.smtp_host, port, timeout=60) as smtp:
                smtp.ehlo()
                smtp.mail("app@example.test")
                code, _ = smtp.rcpt(to)
                if code == 250:
                    smtp.data(mail(to))
                else:
                    with lock:
                        refused.append(code)

    threads = [threading.Thread(target=sender, args=(p,)) for p in (chaos_stack.smtp_port, port)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        chaos_stack.kill("smtp2")
        del chaos_stack.procs["smtp2"]
    assert refused == [451] * 5
    assert stored_for(chaos_stack, to) == 15
    with chaos_stack.client() as api:
        assert api.get("/v1/chaos").json()["rules"][0]["applied"] == 5


def test_a_probability_rule_refuses_some_and_counts_each(chaos_stack: Stack) -> None:
    to = address()
    rule = {"recipient": to, "stage": "rcpt", "reply": REPLY, "probability": 0.5}
    assert put_rules(chaos_stack, [rule]).status_code == 200
    refusals = 0
    with smtplib.SMTP(chaos_stack.smtp_host, chaos_stack.smtp_port, timeout=60) as smtp:
        for _ in range(40):
            smtp.ehlo()
            smtp.mail("app@example.test")
            code, _ = smtp.rcpt(to)
            if code == 451:
                refusals += 1
                smtp.rset()
            else:
                assert code == 250
                smtp.data(mail(to))
    # A chance of 2 in 2^40 that this fails on a fair coin.
    assert 0 < refusals < 40
    assert stored_for(chaos_stack, to) == 40 - refusals
    with chaos_stack.client() as api:
        assert api.get("/v1/chaos").json()["rules"][0]["applied"] == refusals


def test_another_namespaces_address_is_refused_with_403(chaos_stack: Stack) -> None:
    with chaos_stack.client(TOKENS["other"]) as api:
        box = api.post("/v1/mailboxes", json={"run_id": "run-o"}).json()["address"]
    mine = address()
    answer = put_rules(
        chaos_stack,
        [
            {"recipient": mine, "stage": "rcpt", "reply": REPLY, "times": 1},
            {"recipient": box, "stage": "rcpt", "reply": REPLY, "times": 1},
        ],
    )
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "recipient_not_owned"
    assert answer.json()["error"]["field"] == "rules.1.recipient"
    # Nothing was set, and the other namespace's mail still flows.
    with chaos_stack.client() as api:
        assert api.get("/v1/chaos").json()["rules"] == []
    assert send_with_retries(chaos_stack, mail(box), box, attempts=1) == 1
    assert send_with_retries(chaos_stack, mail(mine), mine, attempts=1) == 1


BAD_RULES: list[tuple[dict[str, Any], str]] = [
    ({"reply": "250 OK"}, "rules.0.reply"),
    ({"reply": "451 4.3.0 a\r\n250 smuggled"}, "rules.0.reply"),
    ({"reply": "451 5.3.0 wrong class"}, "rules.0.reply"),
    ({"stage": "mail"}, "rules.0.stage"),
    ({"times": 0}, "rules.0.times"),
    ({"times": None, "probability": 1.5}, "rules.0.probability"),
    ({"times": None, "probability": 0}, "rules.0.probability"),
    ({"probability": 0.5}, "rules.0"),  # both
    ({"times": None}, "rules.0"),  # neither
    ({"recipient": "not an address"}, "rules.0.recipient"),
    ({"recipient": "*@bad domain"}, "rules.0.recipient"),
]


def test_bad_rules_get_422_naming_the_field_and_change_nothing(chaos_stack: Stack) -> None:
    good = {"recipient": address(), "stage": "rcpt", "reply": REPLY, "times": 1}
    assert put_rules(chaos_stack, [good]).status_code == 200
    for rule, field in BAD_RULES:
        answer = put_rules(chaos_stack, [{**good, **rule}])
        assert answer.status_code == 422, (rule, answer.text)
        assert answer.json()["error"]["field"] == field, rule
    with chaos_stack.client() as api:
        assert [r["recipient"] for r in api.get("/v1/chaos").json()["rules"]] == [good["recipient"]]


def test_rules_end_on_their_own(chaos_stack: Stack) -> None:
    to, stays = address(), address()
    rule = {"recipient": to, "stage": "rcpt", "reply": REPLY, "times": 100}
    answer = put_rules(
        chaos_stack, [{**rule, "expires_in_seconds": 1}, {**rule, "recipient": stays}]
    )
    assert answer.status_code == 200, answer.text
    assert send_with_retries(chaos_stack, mail(to), to, attempts=1) == 0
    time.sleep(1.5)
    with chaos_stack.client() as api:
        assert [r["recipient"] for r in api.get("/v1/chaos").json()["rules"]] == [stays]
    assert send_with_retries(chaos_stack, mail(to), to, attempts=1) == 1


def test_delete_ends_every_rule_at_once_and_reports_their_counts(chaos_stack: Stack) -> None:
    to = address()
    rule = {"recipient": to, "stage": "rcpt", "reply": REPLY, "times": 100}
    assert put_rules(chaos_stack, [rule]).status_code == 200
    assert send_with_retries(chaos_stack, mail(to), to, attempts=3) == 0
    with chaos_stack.client() as api:
        deleted = api.delete("/v1/chaos")
        assert deleted.status_code == 200
        assert deleted.json()["rules"] == []
        assert deleted.json()["deleted"][0]["recipient"] == to
        assert api.get("/v1/chaos").json()["rules"] == []
    # At once: the very next message is delivered.
    assert send_with_retries(chaos_stack, mail(to), to, attempts=1) == 1


def test_chaos_needs_a_token(chaos_stack: Stack) -> None:
    with chaos_stack.client("no-such-token") as api:
        assert api.get("/v1/chaos").status_code == 401
        assert api.put("/v1/chaos", json={"rules": []}).status_code == 401
