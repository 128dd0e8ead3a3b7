"""The API's limits before any work: request headers over 64 KiB get 431,
and unknown tokens are throttled per client address (429 after 20 failures
in a minute), with valid tokens never refused."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Callable

import httpx
import pytest
import redis

from app.settings import load_settings
from app.usecases import auth
from tests.security.rawhttp import RawResponse, _read_response
from tests.servers import free_port
from tests.stack import Stack

pytestmark = pytest.mark.integration

KIB = 1024


def send_head(port: int, head: bytes, *, read_after_sending: bool = False) -> RawResponse:
    """Send `head` from a thread (the server may stop reading it part way)
    and read the answer as it comes, or only once all of it is sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)

    def sender() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(head)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    if read_after_sending:
        thread.join(timeout=60)
    try:
        return _read_response(sock)
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(timeout=30)


def head(path: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def filler(total: int, size: int = KIB) -> list[tuple[str, str]]:
    """Headers `X-Fill-N` of `size` bytes each, `total` bytes of values in all."""
    return [(f"X-Fill-{i}", "f" * size) for i in range(total // size)]


def test_a_fifteen_megabyte_header_gets_431_before_any_token_check(stack: Stack) -> None:
    # No token at all: a server that looked at the token first would say 401.
    answer = send_head(stack.api_port, head("/v1/signals", [("X-Big", "a" * (15 * KIB * KIB))]))
    assert answer.status == 431
    assert answer.json()["error"]["code"] == "request_header_fields_too_large"
    assert answer.headers["connection"] == "close"
    assert httpx.get(f"{stack.api_url}/healthz", timeout=10).status_code == 200


def test_the_431_reaches_a_client_that_reads_only_after_sending_its_head(stack: Stack) -> None:
    # The server drops the rest of the head instead of closing on it (a close
    # with unread bytes resets the connection, and the answer with it).
    big = head("/v1/signals", [("X-Big", "a" * (8 * KIB * KIB))])
    answer = send_head(stack.api_port, big, read_after_sending=True)
    assert answer.status == 431


def test_many_headers_over_64_kib_get_431_even_with_a_valid_token(stack: Stack) -> None:
    auth_header = ("Authorization", f"Bearer {stack.token}")
    answer = send_head(stack.api_port, head("/v1/signals", [auth_header, *filler(66 * KIB)]))
    assert answer.status == 431


def test_headers_under_64_kib_are_served(stack: Stack) -> None:
    auth_header = ("Authorization", f"Bearer {stack.token}")
    answer = send_head(
        stack.api_port,
        head("/v1/signals?run_id=r", [auth_header, ("Connection", "close"), *filler(60 * KIB)]),
    )
    assert answer.status == 200, answer.body


def from_address() -> dict[str, str]:
    """A client address of this test's own: uvicorn takes X-Forwarded-For from
    a loopback peer, so other tests' failures (from 127.0.0.1) do not count."""
    n = uuid.uuid4().int
    return {"X-Forwarded-For": f"2001:db8::{n % 65536:x}:{(n >> 16) % 65536:x}"}


def test_unknown_tokens_get_429_after_20_failures_from_one_address(stack: Stack) -> None:
    address = from_address()
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        for _ in range(auth.FAILURES_PER_WINDOW):
            r = client.get("/v1/signals", headers={**address, "Authorization": "Bearer guess"})
            assert r.status_code == 401
        r = client.get("/v1/signals", headers={**address, "Authorization": "Bearer guess"})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "too_many_failures"
        assert 1 <= int(r.headers["retry-after"]) <= 60
        # A valid token from the same address is never throttled.
        valid = {**address, "Authorization": f"Bearer {stack.token}"}
        ok = client.get("/v1/signals?run_id=r", headers=valid)
        assert ok.status_code == 200
        # Another address has its own count.
        other = client.get(
            "/v1/signals", headers={**from_address(), "Authorization": "Bearer guess"}
        )
        assert other.status_code == 401


def test_requests_without_a_token_are_not_counted_as_failures(stack: Stack) -> None:
    address = from_address()
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        for _ in range(auth.FAILURES_PER_WINDOW + 5):
            assert client.get("/v1/signals", headers=address).status_code == 401
        r = client.get("/v1/signals", headers={**address, "Authorization": "Bearer guess"})
        assert r.status_code == 401


def _seed(url: str, address: str, age_seconds: float) -> None:
    """Twenty failures of `address`, `age_seconds` old by Redis's clock."""
    client = redis.Redis.from_url(url)
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    key = auth.FAILURE_KEY_PREFIX + address
    client.delete(key)
    client.zadd(key, {f"seed-{i}": now - age_seconds for i in range(auth.FAILURES_PER_WINDOW)})
    client.expire(key, 120)


def test_retry_after_is_when_the_oldest_failure_leaves_the_minute(redis_url: str) -> None:
    settings = load_settings(redis_url=redis_url)
    address = f"seeded-{uuid.uuid4().hex}"
    _seed(redis_url, address, age_seconds=45)
    wait = auth.failure_record(settings, address)
    assert wait is not None and 0 < wait <= 15
    # The refused attempt was not counted: once those 20 leave the minute,
    # the address fails (401) again.
    _seed(redis_url, address, age_seconds=61)
    assert auth.failure_record(settings, address) is None


def test_the_throttle_counts_in_the_process_when_redis_is_down() -> None:
    """Redis down (nothing listens on its port): the failures are still
    counted, in this process, and the 21st is refused."""
    settings = load_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    address = f"down-{uuid.uuid4().hex}"
    for _ in range(auth.FAILURES_PER_WINDOW):
        assert auth.failure_record(settings, address) is None
    wait = auth.failure_record(settings, address)
    assert wait is not None and 0 < wait <= auth.FAILURE_WINDOW_SECONDS
    # Another address has its own count.
    assert auth.failure_record(settings, f"down-{uuid.uuid4().hex}") is None


def test_x_forwarded_for_is_ignored_from_a_peer_not_in_trusted_proxies(
    stack_factory: Callable[..., Stack],
) -> None:
    """SIGNALBOX_TRUSTED_PROXIES names the ingress (here a network the test
    is not in): a client that makes up a new X-Forwarded-For each time is
    still counted by its own address, and refused after 20 failures."""
    stack = stack_factory({"SIGNALBOX_TRUSTED_PROXIES": "192.0.2.0/24"})
    redis.Redis.from_url(stack.env["SIGNALBOX_BROKER_URL"]).delete(
        auth.FAILURE_KEY_PREFIX + "127.0.0.1"
    )
    stack.start_api()
    with httpx.Client(base_url=stack.api_url, timeout=30) as client:
        answers = [
            client.get(
                "/v1/signals", headers={**from_address(), "Authorization": "Bearer guess"}
            ).status_code
            for _ in range(auth.FAILURES_PER_WINDOW + 1)
        ]
    assert answers == [401] * auth.FAILURES_PER_WINDOW + [429]


def test_without_redis_the_throttle_counts_in_the_process() -> None:
    address = f"memory-{uuid.uuid4().hex}"
    for i in range(auth.FAILURES_PER_WINDOW):
        assert auth._memory_record(address, 1000.0 + i) is None
    assert auth._memory_record(address, 1030.0) == pytest.approx(30.0)
    # The refused one is not counted: the first failure leaves at 1060.
    assert auth._memory_record(address, 1060.5) is None


def test_an_api_of_two_worker_processes_also_answers_431(
    stack_factory: Callable[..., Stack],
) -> None:
    # uvicorn's worker processes import the protocol by its path (`up` runs one per core).
    stack = stack_factory({"SIGNALBOX_API_WORKERS": "2"})
    stack.start_api()
    answer = send_head(stack.api_port, head("/v1/signals", filler(70 * KIB)))
    assert answer.status == 431
