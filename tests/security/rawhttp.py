"""HTTP over a bare socket, for requests an ordinary client will not make
(a body announced but never sent, chunked uploads of any size)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _read_response(sock: socket.socket) -> RawResponse:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {buf!r}")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return RawResponse(status, headers, rest[:length])


def request(
    port: int,
    method: str,
    path: str,
    *,
    headers: dict[str, str],
    body: Iterable[bytes] = (),
    chunked: bool = False,
    timeout: float = 30,
) -> RawResponse:
    """Send the head at once and the body from a thread (ignoring a server
    that hangs up early), and read the response as soon as it comes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    head = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    if chunked:
        head.append("Transfer-Encoding: chunked")
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())

    def send_body() -> None:
        with contextlib.suppress(OSError):
            for piece in body:
                if chunked:
                    sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                else:
                    sock.sendall(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")

    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    try:
        return _read_response(sock)
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        sender.join(timeout=10)
