"""One webhook attempt at a time, in this process, on real PostgreSQL and a
real loopback HTTP server: the guarded outcome, the lease, the backoff."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from app.db.engine import get_engine, transaction
from app.domain.states import Status
from app.settings import get_settings
from app.usecases import signals, webhooks
from app.usecases.expiry import expire_signal
from app.usecases.inputs import SignalCreate
from tests.servers.webhook_receiver import Receiver
from tests.stack import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def configured(
    service_env: dict[str, str],
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Receiver]:
    monkeypatch.setenv("SIGNALBOX_DEAD_LETTER_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("SIGNALBOX_DEAD_LETTER_WEBHOOK_SECRET", "s3cret")
    monkeypatch.setenv("SIGNALBOX_WEBHOOK_BACKOFF_BASE_SECONDS", "0.2")
    monkeypatch.setenv("SIGNALBOX_WEBHOOK_BACKOFF_CAP_SECONDS", "0.5")
    get_settings.cache_clear()
    yield receiver
    # Close this process's pooled connections (the shared reset only drops them).
    get_engine().dispose()
    get_settings.cache_clear()


def new_dead_letter() -> str:
    created = signals.signal_create(
        get_settings(),
        "default",
        SignalCreate(
            run_id=f"run-{uuid.uuid4().hex[:6]}",
            test_case="test_x",
            recipient=f"u-{uuid.uuid4().hex[:6]}@example.test",
        ),
        None,
    )
    with transaction() as session:
        dead_letter_id = expire_signal(
            session, created.view["signal_id"], expected=Status.WAITING, reason="deadline"
        )
    assert dead_letter_id
    return dead_letter_id


def test_attempts_are_recorded_until_one_succeeds_and_then_never_again(
    configured: Receiver,
) -> None:
    started = int(time.time())
    dl = new_dead_letter()
    outcomes: list[str] = []

    def attempt() -> bool:
        outcomes.append(webhooks.deliver(dl))
        return outcomes[-1] == "delivered"

    wait_until(attempt, 20, interval=0.1, what="a delivery")
    tried = [o for o in outcomes if o != "skipped"]
    assert tried == ["failed", "failed", "delivered"]
    # Not due while backing off: the calls in between were skipped, not sent.
    assert len(configured.requests) == 3
    assert webhooks.deliver(dl) == "skipped" and webhooks.deliver_due() == 0
    assert len(configured.requests) == 3
    for headers, body, _ in configured.requests:
        t, _, v1 = headers["X-Signalbox-Signature"].removeprefix("t=").partition(",v1=")
        expected = hmac.new(b"s3cret", t.encode() + b"." + body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(v1, expected)
        assert started <= int(t) <= int(time.time())
    with psycopg.connect(str(get_settings().database_url)) as conn:
        rows = conn.execute(
            "SELECT state, attempts, last_status FROM webhook_deliveries"
        ).fetchall()
    assert rows == [("delivered", 3, 200)]


def test_a_delivery_in_flight_is_not_taken_twice(configured: Receiver) -> None:
    configured.failures = 0
    release = threading.Event()
    configured.hold = release  # the receiver answers only once released
    dl = new_dead_letter()
    first: list[str] = []
    worker = threading.Thread(target=lambda: first.append(webhooks.deliver(dl)))
    worker.start()
    wait_until(lambda: configured.started, 20, what="the first attempt to reach the receiver")
    assert webhooks.deliver(dl) == "skipped"  # the first holds the lease
    release.set()
    worker.join(timeout=30)
    assert first == ["delivered"]
    assert len(configured.requests) == 1
