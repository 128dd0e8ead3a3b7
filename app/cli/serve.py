"""`signalbox-server api` and `smtp`: the two parts that serve clients, each
in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
from typing import Any

from app.cli.ports import check_ports, tcp_listener
from app.cli.services import resolve_services
from app.settings import get_settings

# Request headers (names, values, their separators) past this get 431.
MAX_HEADER_BYTES = 64 * 1024
# A header line is only seen once it is complete, so the parser buffers a
# long one: the bytes of a head are also counted as they arrive and cut off
# this far past the limit (one read of the event loop is up to 256 KiB).
_RAW_HEAD_SLACK = 256 * 1024
# After a 431 the rest of the head is read and dropped for this long, so the
# answer reaches the client instead of a reset.
_LINGER_SECONDS = 5.0
_LINGER_BYTES = 64 * 1024 * 1024


def header_limited_protocol() -> type:
    """uvicorn's httptools protocol, answering 431 to a header block over
    MAX_HEADER_BYTES before the app sees the request (httptools itself has no
    limit)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return _protocol_class(HttpToolsProtocol)


def _protocol_class(base: type) -> type:
    class HeaderLimitedProtocol(base):  # type: ignore[misc,valid-type]  # uvicorn's own class
        _head_bytes = 0
        _raw_head = 0
        _in_head = False
        _head_ended = False
        _too_large = False
        _lingered = 0

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0

        def on_header(self, name: bytes, value: bytes) -> None:
            self._head_bytes += len(name) + len(value) + 4
            if self._head_bytes > MAX_HEADER_BYTES:
                self._too_large = True
                raise ValueError("request headers too large")  # the parser stops here
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head, self._head_ended, self._raw_head = False, True, 0
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            if self._too_large:  # lingering after the 431: drop what comes
                self._lingered += len(data)
                if self._lingered > _LINGER_BYTES:
                    self.transport.close()
                return
            self._head_ended = False
            super().data_received(data)
            if self._too_large or self._head_ended or not self._in_head:
                return
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
            loop = asyncio.get_running_loop()
            loop.call_later(_LINGER_SECONDS, self.transport.close)

    return HeaderLimitedProtocol


def api_factory() -> Any:
    """The ASGI app of one uvicorn worker process (SIGNALBOX_API_WORKERS > 1)."""
    from app.api.app import create_app
    from app.observability.logs import configure_logging

    settings = get_settings()
    configure_logging("api", settings.log_level)
    return create_app(settings)


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from app.observability.exposition import serve_metrics_port

    check_ports(get_settings(), ["api", "metrics"])
    settings, _handles = resolve_services(get_settings())
    workers = settings.api_workers or 1
    # Served by this (the supervising) process: it merges every uvicorn worker's files.
    serve_metrics_port(settings, "api")
    common: dict[str, Any] = {
        "host": settings.api_host,
        "port": settings.api_port,
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": 5,
        "http": header_limited_protocol(),
    }
    if workers > 1:
        from uvicorn.supervisors import Multiprocess

        # Each worker process has its own long-poll notifier (LISTEN on PostgreSQL).
        config = uvicorn.Config(
            "app.cli.serve:api_factory", factory=True, workers=workers, **common
        )
        Multiprocess(config, sockets=[tcp_listener(settings.api_host, settings.api_port)]).run()
    else:
        uvicorn.run(api_factory(), **common)
    return 0


def cmd_smtp(args: argparse.Namespace) -> int:
    from app.observability.exposition import serve_metrics_port
    from app.observability.logs import configure_logging
    from app.smtp.server import make_controller

    check_ports(get_settings(), ["smtp", "metrics"])
    settings, _handles = resolve_services(get_settings())
    configure_logging("smtp", settings.log_level)
    serve_metrics_port(settings, "smtp")
    controller = make_controller(settings)
    controller.start()
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    controller.stop()
    return 0
