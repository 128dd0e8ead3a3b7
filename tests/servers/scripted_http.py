"""A loopback HTTP server that answers GETs from a table."""

from __future__ import annotations

import http.server
import json
import threading
from dataclasses import dataclass, field

from tests.servers.base import LOOPBACK


@dataclass
class ScriptedResponse:
    """What `ScriptedHttpServer` answers to one path."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class ScriptedHttpServer:
    """A loopback HTTP server answering GETs from a table, recording every path asked.

    For the answers a real server will not give on demand (5xx, 429 with
    Retry-After, garbage JSON). Unknown paths get 404. Change `routes` at
    any time; `requests` lists the paths in order.
    """

    def __init__(self, routes: dict[str, ScriptedResponse] | None = None) -> None:
        self.routes: dict[str, ScriptedResponse] = dict(routes or {})
        self.requests: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.requests.append(self.path)
                answer = owner.routes.get(self.path, ScriptedResponse(404, b'"not found"'))
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: object) -> None:
                return  # keep test output clean

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://{LOOPBACK}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def json(self, path: str, payload: object, status: int = 200) -> None:
        """Answer `path` with `payload` as JSON."""
        self.routes[path] = ScriptedResponse(
            status, json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> ScriptedHttpServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
