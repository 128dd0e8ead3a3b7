"""The API's listening socket for several uvicorn workers: accepted
connections get TCP_NODELAY (no ~40 ms wait for a delayed ACK per response)."""

from __future__ import annotations

import asyncio
import socket

from app.cli.ports import tcp_listener


async def _nodelay_of_an_accepted_connection(listener: socket.socket) -> int:
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Report(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Report, sock=listener)
    try:
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        result = await asyncio.wait_for(seen, 5)
        writer.close()
        return result
    finally:
        server.close()
        await server.wait_closed()


def test_accepted_connections_get_tcp_nodelay() -> None:
    listener = tcp_listener("127.0.0.1", 0)
    assert listener.proto == socket.IPPROTO_TCP
    assert listener.get_inheritable()
    assert asyncio.run(_nodelay_of_an_accepted_connection(listener)) == 1
