"""Signals watched on real external providers (Dovecot IMAP, MailDev) through the
whole stack: coalesced checks, the Redis circuit breaker, provider errors and
the dead-letter queue."""

from __future__ import annotations

import base64
import itertools
import json
import smtplib
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import httpx
import pytest
import redis

from app.providers.breaker import KEY_PREFIX, CircuitBreaker
from tests.integration.helpers import db_rows, mail, signal_view
from tests.servers import (
    CountingProxy,
    DovecotServer,
    MaildevServer,
)
from tests.stack import Stack, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.providers]


@pytest.fixture
def proxy(maildev: MaildevServer) -> Iterator[CountingProxy]:
    with CountingProxy(maildev.host, maildev.web_port) as p:
        yield p


def provider_stack(stack_factory: Callable[..., Stack], providers_toml: str, **env: str) -> Stack:
    stack = stack_factory(env)
    (stack.logs.parent / "providers.toml").write_text(providers_toml)
    return stack


def create(stack: Stack, provider: str, **fields: object) -> dict:
    payload = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": f"case-{uuid.uuid4().hex[:6]}",
        "recipient": f"user-{uuid.uuid4().hex[:6]}@example.test",
        "provider": provider,
        "expires_in_seconds": 120,
        "max_checks": 1000,
        **fields,
    }
    with stack.client() as api:
        r = api.post("/v1/signals", json=payload)
    assert r.status_code == 201, r.text
    return r.json()


def send_to_maildev(server: MaildevServer, to: str, run_id: str | None = None) -> None:
    with smtplib.SMTP(server.host, server.smtp_port, timeout=10) as smtp:
        smtp.sendmail("app@example.test", [to], mail(to, run=run_id))


def in_maildev(server: MaildevServer, to: str) -> bool:
    """Whether MailDev lists mail to `to` (it answers the SMTP DATA before it lists the mail)."""
    listed = httpx.get(f"{server.url}/email", timeout=10).json()
    return any(r["address"] == to for m in listed for r in m["envelope"]["to"])


def test_imap_message_delivered_after_the_signal_is_found(
    stack_factory: Callable[..., Stack], dovecot: DovecotServer
) -> None:
    stack = provider_stack(
        stack_factory,
        f"""
[providers.corp-imap]
type = "imap"
host = "{dovecot.host}"
port = {dovecot.port}
tls = false
username = "{dovecot.username}"
password_env = "TEST_IMAP_PASSWORD"
""",
        TEST_IMAP_PASSWORD=dovecot.password,
    ).start()
    signal = create(stack, "corp-imap")
    other = create(stack, "corp-imap")
    time.sleep(1)
    dovecot.append(mail(signal["recipient"]))

    found = signal_view(stack, signal["signal_id"], wait=30)
    assert found["status"] == "found"
    # The other signal keeps checking the same mailbox: the message stays recorded once.
    wait_until(
        lambda: signal_view(stack, other["signal_id"])["checks"] >= 3, 30, what="repeated checks"
    )
    assert db_rows(stack, "SELECT count(*) FROM messages WHERE provider = 'corp-imap'") == [(1,)]


def test_maildev_message_is_found_and_recorded_once_across_checks(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    stack = provider_stack(
        stack_factory, f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    ).start()
    signal = create(stack, "catcher")
    others = [create(stack, "catcher") for _ in range(5)]
    send_to_maildev(maildev, signal["recipient"])
    with stack.client() as api:
        assert api.post("/v1/inbound/catcher").status_code == 202

    assert signal_view(stack, signal["signal_id"], wait=30)["status"] == "found"
    wait_until(
        lambda: all(signal_view(stack, o["signal_id"])["checks"] >= 4 for o in others),
        30,
        what="repeated checks",
    )
    assert db_rows(stack, "SELECT count(*) FROM messages WHERE provider = 'catcher'") == [(1,)]
    # Coalesced: provider calls (batches) are fewer than checks, and some
    # single call answered several signals.
    calls, checks, widest = db_rows(
        stack,
        "SELECT count(DISTINCT batch_id), count(*), max(n) FROM checks"
        " JOIN (SELECT batch_id AS b, count(*) AS n FROM checks GROUP BY 1) w ON w.b = batch_id",
    )[0]
    assert calls < checks and widest >= 2


def push(stack: Stack, provider: str) -> None:
    """The provider's webhook: its waiting signals are checked now."""
    with stack.client() as api:
        assert api.post(f"/v1/inbound/{provider}").status_code == 202


def skipped_by_the_breaker(stack: Stack) -> int:
    # Not `provider_busy`: the bulkhead records those as circuit_open too.
    return db_rows(
        stack,
        "SELECT count(*) FROM checks"
        " WHERE outcome = 'circuit_open' AND error_code = 'circuit_open'",
    )[0][0]


def test_breaker_opens_while_maildev_is_down_and_closes_when_it_is_back(
    stack_factory: Callable[..., Stack], maildev: MaildevServer, proxy: CountingProxy
) -> None:
    """While MailDev is down the breaker opens; while it is open checks go on,
    recorded as circuit_open without spending budget, and no connection
    reaches the provider; once MailDev is back and the open period is over,
    the probe closes the breaker and every signal is found."""
    stack = provider_stack(
        stack_factory,
        f'[providers.catcher]\ntype = "maildev"\nurl = "{proxy.url}"\n',
        SIGNALBOX_BREAKER_FAILURE_THRESHOLD="3",
        # Far longer than the test looks at the open breaker, however slowly
        # it runs: a shorter period could end (a probe connects) between its
        # observations. The test ends the period itself, below.
        SIGNALBOX_BREAKER_OPEN_SECONDS="600",
        SIGNALBOX_MAX_CONSECUTIVE_PROVIDER_ERRORS="1000",
    ).start()
    # Deadlines beyond the test: a final look is made even while the breaker is open.
    signals = [create(stack, "catcher", expires_in_seconds=3600) for _ in range(20)]
    wait_until(
        lambda: all(signal_view(stack, s["signal_id"])["checks"] >= 1 for s in signals),
        30,
        what="a first check of every signal",
    )
    store = redis.Redis.from_url(stack.env["SIGNALBOX_REDIS_URL"])
    breaker = CircuitBreaker(store, "catcher", failure_threshold=3)
    maildev.stop()

    wait_until(
        lambda: all(
            signal_view(stack, s["signal_id"])["result"] == "provider_error" for s in signals
        ),
        30,
        what="every result to turn provider_error",
    )
    wait_until(lambda: breaker.state() == "open", 30, what="the breaker to open")
    # The worker's bulkhead lets one call to the provider run at a time, and
    # the proxy counts a connection before the call can fail: the call whose
    # failure opened the breaker is already counted.
    seen = proxy.connections
    skipped_before = skipped_by_the_breaker(stack)
    # Due now, so checks meet the open breaker (refused ones wait for its end).
    push(stack, "catcher")
    wait_until(
        lambda: skipped_by_the_breaker(stack) > skipped_before,
        30,
        what="checks recorded as circuit_open",
    )
    assert breaker.state() == "open"
    assert proxy.connections == seen  # nothing reached the provider while open
    a_view = signal_view(stack, signals[0]["signal_id"])
    assert a_view["last_check"]["error_code"] is not None
    assert a_view["retry_after_seconds"] >= 1

    maildev.start()
    for s in signals:
        send_to_maildev(maildev, s["recipient"])
    # End the open period as time would: the breaker stores half-open as
    # "open, with open_until passed". The next check is then its probe.
    store.hset(f"{KEY_PREFIX}state:catcher", "open_until", repr(time.time()))
    push(stack, "catcher")  # the signals wait for the period's old end otherwise
    wait_until(
        lambda: all(signal_view(stack, s["signal_id"])["status"] == "found" for s in signals),
        60,
        interval=0.5,
        what="every signal found after MailDev came back",
    )
    assert breaker.state() == "closed"
    # circuit_open checks spent no budget, and the budget is exactly the rows
    # marked counted (not every other row: a provider error that came with a
    # Retry-After spends none either).
    budget = db_rows(
        stack,
        "SELECT s.checks_count, count(c.*) FILTER (WHERE c.counted),"
        " count(c.*) FILTER (WHERE c.counted AND c.outcome = 'circuit_open')"
        " FROM signals s JOIN checks c ON c.signal_id = s.id GROUP BY s.id",
    )
    assert all(counted == real and skipped == 0 for counted, real, skipped in budget), budget


def looks_of_a_signal_found_at_its_deadline(
    stack: Stack, maildev: MaildevServer, expires_in: int
) -> list[tuple[str, str | None, bool]] | None:
    """Create a signal and put its mail in MailDev. If the mail was there
    before the deadline, assert the signal is found and return its checks in
    order: (outcome, error code, made at or after the deadline). Else None:
    the final look may rightly miss mail that came after the deadline."""
    signal = create(stack, "catcher", expires_in_seconds=expires_in)
    send_to_maildev(maildev, signal["recipient"], run_id=signal["run_id"])
    wait_until(lambda: in_maildev(maildev, signal["recipient"]), 30, what="the mail in MailDev")
    in_time = datetime.now(UTC) < datetime.fromisoformat(signal["expires_at"])

    def settled() -> dict | None:
        view = signal_view(stack, signal["signal_id"])
        return view if view["status"] != "waiting" else None

    # Generous: on a loaded machine the look at the deadline may come late.
    view = wait_until(
        settled, expires_in + 90, interval=0.5, what="the signal to be found or to expire"
    )
    if not in_time:
        return None
    assert view["status"] == "found", view
    return db_rows(
        stack,
        "SELECT c.outcome, c.error_code, c.started_at >= s.expires_at"
        " FROM checks c JOIN signals s ON s.id = c.signal_id"
        " WHERE c.signal_id = %s ORDER BY c.started_at, c.id",
        signal["signal_id"],
    )


# A second or third try, on a stalled machine, adds up to 150 s of deadlines.
@pytest.mark.timeout(600)
def test_the_final_look_is_made_while_the_breaker_is_open(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """The breaker is held open for minutes (MailDev is up): checks before the
    deadline are skipped, but the look at the deadline still reads MailDev,
    so mail that was there before the deadline is found, not expired."""
    stack = provider_stack(
        stack_factory,
        f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n',
        SIGNALBOX_BREAKER_FAILURE_THRESHOLD="1",
        SIGNALBOX_BREAKER_OPEN_SECONDS="600",
        SIGNALBOX_DEADLINE_GRACE_SECONDS="60",
    ).start()
    breaker = CircuitBreaker(
        redis.Redis.from_url(stack.env["SIGNALBOX_REDIS_URL"]),
        "catcher",
        failure_threshold=1,
        open_seconds=600,
    )
    breaker.record_failure()
    assert breaker.state() == "open"

    # A try proves the claim only if the mail reached MailDev before the
    # deadline and the worker made a look before it (its first, made whenever
    # it gets to the check). On a stalled machine either can miss a short
    # deadline: such a try says nothing for or against the claim, so it is
    # made again with a longer deadline. The short first one keeps a usual
    # run short.
    skipped: list[tuple[str, str | None]] = []
    for expires_in in (5, 30, 120):
        looks = looks_of_a_signal_found_at_its_deadline(stack, maildev, expires_in)
        if looks is None:
            continue
        assert looks[-1][0] == "matched" and looks[-1][2], looks  # the look at the deadline
        skipped = [(outcome, error) for outcome, error, final in looks if not final]
        assert all(outcome == "circuit_open" for outcome, _ in skipped), looks
        if skipped:
            break
    # Skipped by the breaker, before the deadline:
    assert ("circuit_open", "circuit_open") in skipped, "no try had its mail and a look in time"
    assert breaker.state() == "open"  # all along: the final look did not wait for it


def test_signals_expire_with_provider_errors_when_maildev_never_returns(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    stack = provider_stack(
        stack_factory,
        f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n',
        SIGNALBOX_BREAKER_FAILURE_THRESHOLD="2",
        SIGNALBOX_BREAKER_OPEN_SECONDS="1",
        SIGNALBOX_MAX_CONSECUTIVE_PROVIDER_ERRORS="3",
    )
    stack.start(worker_queues="signals")  # leaves `dead_letter` messages countable
    maildev.stop()
    signals = [create(stack, "catcher") for _ in range(5)]

    wait_until(
        lambda: all(signal_view(stack, s["signal_id"])["status"] == "expired" for s in signals),
        60,
        interval=0.5,
        what="every signal to expire",
    )
    for s in signals:
        v = signal_view(stack, s["signal_id"])
        assert v["expiry_reason"] == "provider_errors"
        assert v["dead_letter"]["reason"] == "provider_errors"
        assert v["dead_letter"]["last_error_code"]
        assert v["dead_letter"]["last_error_code"] in v["dead_letter"]["recommendation"]
    per_signal = db_rows(stack, "SELECT signal_id, count(*) FROM dead_letters GROUP BY 1")
    assert len(per_signal) == 5 and all(n == 1 for _, n in per_signal)
    broker = redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"])
    wait_until(lambda: broker.llen("dead_letter") >= 5, 10, what="5 dead-letter messages")
    published = sorted(
        json.loads(base64.b64decode(json.loads(m)["body"]))[0][0]
        for m in broker.lrange("dead_letter", 0, -1)
    )
    assert published == sorted(r[0] for r in db_rows(stack, "SELECT id FROM dead_letters"))


def test_rate_limited_provider_delays_checks_without_spending_budget(
    stack_factory: Callable[..., Stack],
) -> None:
    from tests.servers import ScriptedHttpServer, ScriptedResponse

    scripted = ScriptedHttpServer(
        {"/email": ScriptedResponse(429, b'"slow down"', {"Retry-After": "3"})}
    )
    try:
        stack = provider_stack(
            stack_factory,
            f'[providers.limited]\ntype = "maildev"\nurl = "{scripted.url}"\n',
            SIGNALBOX_BREAKER_FAILURE_THRESHOLD="1000",
            SIGNALBOX_MAX_CONSECUTIVE_PROVIDER_ERRORS="2",
        ).start()
        signal = create(stack, "limited", max_checks=2)
        wait_until(
            lambda: db_rows(stack, "SELECT count(*) FROM checks")[0][0] >= 3,
            30,
            what="three checks",
        )
        v = signal_view(stack, signal["signal_id"])
        assert v["status"] == "waiting" and v["result"] == "provider_error"
        assert v["last_check"]["error_code"] == "rate_limited"
        assert v["checks"] == 0  # no budget spent, no provider_errors expiry
        times = [t for (t,) in db_rows(stack, "SELECT started_at FROM checks ORDER BY fence")]
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        assert all(gap >= 2.5 for gap in gaps), gaps  # Retry-After: 3 was honoured
    finally:
        scripted.close()
