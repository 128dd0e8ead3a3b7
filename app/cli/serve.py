"""`signalbox-server api` and `smtp`: the two parts that serve clients, each
in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from app.cli.ports import check_ports, tcp_listener
from app.cli.services import resolve_services
from app.settings import Settings, get_settings

# uvicorn's httptools protocol with a 431 for a header block over 64 KiB
# (httptools has no limit of its own); named by import path, so that uvicorn's
# worker processes (SIGNALBOX_API_WORKERS > 1) import it rather than unpickle it.
HTTP_PROTOCOL = "app.cli.http_protocol:HeaderLimitedProtocol"


def api_factory() -> Any:
    """The ASGI app of one uvicorn worker process (SIGNALBOX_API_WORKERS > 1)."""
    from app.observability.logs import configure_logging
    from app.server import create_app

    settings = get_settings()
    configure_logging("api", settings.log_level, settings.log_format)
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
        "http": HTTP_PROTOCOL,
        # X-Forwarded-For is believed from SIGNALBOX_TRUSTED_PROXIES only (never
        # from uvicorn's FORWARDED_ALLOW_IPS): the client address the
        # auth-failure throttle counts by.
        "proxy_headers": bool(settings.trusted_proxies.strip()),
        "forwarded_allow_ips": settings.trusted_proxies.strip() or "",
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
    """The sink: one process, or (SIGNALBOX_SMTP_PROCESSES > 1) a supervisor
    of that many, each started as `smtp --process I/N`."""
    from app.observability.exposition import serve_metrics_port
    from app.observability.logs import configure_logging

    if args.process:
        # One of several: its supervisor checked the ports and serves the metrics.
        settings, _handles = resolve_services(get_settings())
        configure_logging("smtp", settings.log_level, settings.log_format)
        return _serve_sink(settings, reuse_port=True)
    check_ports(get_settings(), ["smtp", "metrics"])
    settings, _handles = resolve_services(get_settings())
    configure_logging("smtp", settings.log_level, settings.log_format)
    serve_metrics_port(settings, "smtp")
    if settings.smtp_processes > 1:
        from app.cli.sink_processes import supervise

        return supervise(settings)
    return _serve_sink(settings, reuse_port=False)


def _serve_sink(settings: Settings, *, reuse_port: bool) -> int:
    from app.smtp.server import make_controller

    controller = make_controller(settings, reuse_port=reuse_port)
    controller.start()
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    controller.stop()
    return 0
