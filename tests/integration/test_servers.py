"""The test servers themselves: `DelayingProxy` slows a real server down on demand."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.servers import DelayingProxy, ScriptedHttpServer

pytestmark = pytest.mark.integration


@pytest.fixture
def http_server() -> Iterator[ScriptedHttpServer]:
    with ScriptedHttpServer() as server:
        server.json("/email", [{"id": "a"}])
        yield server


def test_delaying_proxy_passes_bytes_unchanged_when_not_delayed(
    http_server: ScriptedHttpServer,
) -> None:
    with DelayingProxy("127.0.0.1", http_server.port) as proxy:
        answer = httpx.get(f"{proxy.url}/email", timeout=5)

    assert answer.status_code == 200
    assert answer.json() == [{"id": "a"}]
    assert proxy.connections == 1


def test_delaying_proxy_makes_answers_slower_than_a_client_timeout_until_the_delay_is_lifted(
    http_server: ScriptedHttpServer,
) -> None:
    with DelayingProxy("127.0.0.1", http_server.port, server_delay=3) as proxy:
        began = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{proxy.url}/email", timeout=httpx.Timeout(5, read=0.5))
        proxy.server_delay = 0
        answer = httpx.get(f"{proxy.url}/email", timeout=5)

    assert answer.json() == [{"id": "a"}]
    assert time.monotonic() - began >= 0.5  # the first answer really was held back


def test_delaying_proxy_holds_each_answer_back_at_least_the_delay_it_had_when_read(
    http_server: ScriptedHttpServer,
) -> None:
    with DelayingProxy("127.0.0.1", http_server.port, server_delay=0.6) as proxy:
        began = time.monotonic()
        answer = httpx.get(f"{proxy.url}/email", timeout=10)
        elapsed = time.monotonic() - began

    assert answer.status_code == 200
    assert elapsed >= 0.6


def test_delaying_proxy_delays_the_client_side_when_asked(
    http_server: ScriptedHttpServer,
) -> None:
    with DelayingProxy("127.0.0.1", http_server.port, client_delay=0.6) as proxy:
        began = time.monotonic()
        answer = httpx.get(f"{proxy.url}/email", timeout=10)
        elapsed = time.monotonic() - began

    assert answer.status_code == 200
    assert http_server.requests == ["/email"]
    assert elapsed >= 0.6


def test_delaying_proxy_keeps_chunk_order_when_the_delay_shrinks() -> None:
    """A raw TCP peer: chunks sent under a long delay, then a short one, arrive in order."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while chunk := conn.recv(1024):
                received.append(chunk)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with (
        DelayingProxy("127.0.0.1", listener.getsockname()[1], client_delay=0.8) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as client,
    ):
        client.sendall(b"first.")
        time.sleep(0.1)  # the proxy reads "first." under the long delay
        proxy.client_delay = 0
        client.sendall(b"second.")
        client.shutdown(socket.SHUT_WR)
        thread.join(10)
    listener.close()

    assert b"".join(received) == b"first.second."


def test_delaying_proxy_passes_the_servers_close_on_to_the_client() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"bye")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with (
        DelayingProxy("127.0.0.1", listener.getsockname()[1], server_delay=0.2) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client,
    ):
        data = b""
        while chunk := client.recv(1024):
            data += chunk
    thread.join(5)
    listener.close()

    assert data == b"bye"


def test_delaying_proxy_closes_the_client_when_the_target_refuses() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    with (
        DelayingProxy("127.0.0.1", dead_port) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client,
    ):
        assert client.recv(1024) == b""
    assert proxy.connections == 1
