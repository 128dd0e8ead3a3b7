"""One webhook attempt at a time, in this process, on real PostgreSQL and a
real loopback HTTP server: the guarded outcome, the lease, the backoff."""

from __future__ import annotations

import hashlib
import hmac
import socket
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


@pytest.fixture
def trickler() -> Iterator[tuple[str, list[float]]]:
    """A real loopback HTTP server that reads a request, then trickles its
    answer one byte every 0.2 s (each read is quick, the answer never ends
    in time); the URL and when each connection was closed by the client."""
    server = socket.create_server(("127.0.0.1", 0))
    closed: list[float] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                answer = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
                try:
                    for byte in answer:
                        if stop.is_set():
                            break
                        conn.sendall(bytes([byte]))
                        time.sleep(0.2)
                except OSError:
                    closed.append(time.monotonic())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hooks", closed
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()


def test_a_receiver_that_trickles_its_answer_is_cut_off_at_one_overall_deadline(
    service_env: dict[str, str],
    trickler: tuple[str, list[float]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """httpx's timeout bounds each read; a receiver that sends a byte every
    0.2 s under a 1 s timeout would hold the attempt for 40 s, past the
    lease (timeout + 30 s). One deadline around the POST ends it at 1 s."""
    url, _ = trickler
    monkeypatch.setenv("SIGNALBOX_DEAD_LETTER_WEBHOOK_URL", url)
    monkeypatch.setenv("SIGNALBOX_WEBHOOK_TIMEOUT_SECONDS", "1")
    get_settings.cache_clear()
    try:
        dl = new_dead_letter()
        began = time.monotonic()
        outcome = webhooks.deliver(dl)
        took = time.monotonic() - began
    finally:
        get_engine().dispose()
        get_settings.cache_clear()
    assert outcome == "failed"
    assert took < 5, took
    with psycopg.connect(service_env["SIGNALBOX_DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT last_error FROM webhook_deliveries WHERE dead_letter_id = %s", (dl,)
        ).fetchone()
    assert row == ("DeadlineExceeded",)
