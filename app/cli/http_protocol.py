"""The API's HTTP/1.1 protocol: uvicorn's httptools protocol that answers
431 to a request whose header block is over 64 KiB, before the app (and so
any token check or body read) sees the request. httptools itself has no
limit; uvicorn's `h11_max_incomplete_event_size` bounds the h11 protocol only.

It also sends an answer's head and body in one write (`JoinedWrites`):
uvicorn writes the status line and headers as soon as the app sends
`http.response.start`, and the body separately, two system calls (and two
wake-ups of the client over loopback) where one does.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.infra.joined_writes import JoinedWrites

# Request headers (names, values, their separators) past this get 431.
MAX_HEADER_BYTES = 64 * 1024
# httptools hands over a header line only once it is complete, buffering a
# long one: the bytes of a head are also counted as they arrive and cut off
# this far past the limit (one read of the event loop is up to 256 KiB).
_RAW_HEAD_SLACK = 256 * 1024
# After a 431 the rest of the head is read and dropped (for this long, up to
# this much) so that the answer reaches the client: closing a socket with
# unread data resets the connection, and the client may lose the answer.
_LINGER_SECONDS = 5.0
_LINGER_BYTES = 64 * 1024 * 1024


class HeaderLimitedProtocol(HttpToolsProtocol):
    """Counts each request's header bytes; over MAX_HEADER_BYTES: 431, close."""

    _head_bytes = 0
    _raw_head = 0
    _in_head = False
    _head_ended = False
    _too_large = False
    _lingered = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Flow control keeps the real transport; the answers go through this.
        self.transport = JoinedWrites(transport, self.loop)  # type: ignore[assignment]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEADER_BYTES:
            self._too_large = True
            # The parser stops and uvicorn calls send_400_response (below).
            raise ValueError("request headers too large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_ended, self._raw_head = False, True, 0
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._too_large:  # after the 431: drop what still comes
            self._lingered += len(data)
            if self._lingered > _LINGER_BYTES:
                self.transport.close()
            return
        self._head_ended = False
        super().data_received(data)
        if self._too_large or self._head_ended or not self._in_head:
            return
        # All of `data` belongs to the head still being read.
        self._raw_head += len(data)
        if self._raw_head > MAX_HEADER_BYTES + _RAW_HEAD_SLACK:
            self._too_large = True
            self._refuse()

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._refuse()
        else:
            super().send_400_response(msg)

    def _refuse(self) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "request_header_fields_too_large",
                    "message": f"The request headers are larger than {MAX_HEADER_BYTES} bytes.",
                }
            }
        ).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n"
            b"connection: close\r\n\r\n" + body
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_SECONDS, self.transport.close)
