"""Writes made in one turn of the event loop reach the socket as one.

A protocol that answers in several writes (uvicorn: an HTTP answer's head,
then its body; aiosmtpd: each line of a multi-line reply) makes a system
call, and over loopback a wake-up of the peer, for each. Wrapped in
`JoinedWrites`, its transport joins them and writes at the end of the turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

# A write this large goes out on its own, not copied into a joined buffer.
JOIN_BELOW = 16 * 1024


class JoinedWrites:
    """A transport whose writes within one turn of the event loop reach the
    socket as one. Everything else is the transport's own; closing (or
    writing EOF) sends what is pending first, in order."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if len(data) >= JOIN_BELOW:
            self.flush()
            self._transport.write(data)
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():  # the client may have gone meanwhile
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
