"""Joined writes (the API's and the sink's): an answer's head and body made in one
turn of the event loop reach the socket in one write, in order, and nothing
pending is lost or reordered by a large write, a close or an EOF."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.infra.joined_writes import JOIN_BELOW, JoinedWrites

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RecordingTransport:
    """Records what reaches the socket, and when the transport was closed."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.events.append(("write", bytes(data)))

    def write_eof(self) -> None:
        self.events.append(("eof", None))

    def close(self) -> None:
        self.closing = True
        self.events.append(("close", None))

    def abort(self) -> None:
        self.closing = True
        self.events.append(("abort", None))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


def joined() -> tuple[JoinedWrites, RecordingTransport]:
    transport = RecordingTransport()
    return JoinedWrites(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


async def next_turn() -> None:
    await asyncio.sleep(0)


async def test_head_and_body_written_in_one_turn_go_out_as_one_write() -> None:
    writes, transport = joined()
    writes.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    writes.write(b"{}")
    assert transport.events == []  # nothing before the turn ends
    await next_turn()
    assert transport.events == [("write", b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")]


async def test_writes_of_separate_turns_stay_separate_and_in_order() -> None:
    writes, transport = joined()
    writes.write(b"a")
    await next_turn()
    writes.write(b"b")
    await next_turn()
    assert transport.events == [("write", b"a"), ("write", b"b")]


async def test_writelines_joins_in_order_with_what_is_pending() -> None:
    writes, transport = joined()
    writes.write(b"250-first\r\n")
    writes.writelines([b"250-second\r\n", b"250 last\r\n"])
    await next_turn()
    assert transport.events == [("write", b"250-first\r\n250-second\r\n250 last\r\n")]


async def test_a_large_write_follows_what_is_pending_without_being_joined() -> None:
    writes, transport = joined()
    large = b"x" * JOIN_BELOW
    writes.write(b"head")
    writes.write(large)
    writes.write(b"tail")
    await next_turn()
    assert transport.events == [("write", b"head"), ("write", large), ("write", b"tail")]


async def test_close_and_eof_send_what_is_pending_first() -> None:
    writes, transport = joined()
    writes.write(b"answer")
    writes.write_eof()
    writes.write(b"more")
    writes.close()
    await next_turn()  # the scheduled flush finds nothing left
    assert transport.events == [
        ("write", b"answer"),
        ("eof", None),
        ("write", b"more"),
        ("close", None),
    ]


async def test_nothing_is_written_to_a_transport_the_client_closed_meanwhile() -> None:
    writes, transport = joined()
    writes.write(b"late answer")
    transport.closing = True  # connection lost before the turn ended
    await next_turn()
    assert transport.events == []


async def test_abort_drops_what_is_pending() -> None:
    writes, transport = joined()
    writes.write(b"never sent")
    writes.abort()
    await next_turn()
    assert transport.events == [("abort", None)]


async def test_everything_else_is_the_transports_own() -> None:
    writes, _ = joined()
    assert writes.get_extra_info("peername") == "extra:peername"
    assert writes.is_closing() is False


async def test_a_buffer_written_and_then_reused_is_sent_as_it_was() -> None:
    writes, transport = joined()
    buffer = bytearray(b"first")
    writes.write(buffer)  # type: ignore[arg-type]
    buffer[:] = b"later"
    await next_turn()
    assert transport.events == [("write", b"first")]
