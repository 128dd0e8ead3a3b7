"""A loopback HTTP server that receives webhook POSTs and records them."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.servers.base import LOOPBACK


@dataclass
class Receiver:
    """A real loopback HTTP server that answers 500 to its first `failures` requests."""

    failures: int
    requests: list[tuple[dict[str, str], bytes, int]] = field(default_factory=list)
    port: int = 0
    # When set, each request waits for it before answering (a slow receiver).
    hold: threading.Event | None = None
    started: bool = False

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/hooks/signalbox"

    def delivered(self) -> list[dict]:
        return [json.loads(body) for _, body, status in self.requests if status == 200]


@contextlib.contextmanager
def webhook_receiver(failures: int = 2) -> Iterator[Receiver]:
    """Serve a `Receiver` on a free loopback port until the block ends."""
    state = Receiver(failures=failures)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            state.started = True
            if state.hold is not None:
                state.hold.wait(30)
            with lock:
                status = 500 if len(state.requests) < state.failures else 200
                state.requests.append((dict(self.headers), body, status))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
