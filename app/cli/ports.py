"""The ports the parts listen on: checked before anything starts, waited
for by `up`, and the API's listening socket for uvicorn's worker processes."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from app.errors import ConfigurationError
from app.settings import Settings


def wait_port(host: str, port: int, timeout: float) -> bool:
    """True once something accepts connections on host:port, False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def wait_ready(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll `url` (the API's /readyz) until it answers 200; False after
    `timeout` seconds, or as soon as `alive()` says to stop waiting."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass  # 503 while a part warms up, or not listening yet
        time.sleep(0.5)
    return False


def port_free(host: str, port: int) -> bool:
    """Whether a TCP socket could be bound to host:port now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def check_port(host: str, port: int | None, setting: str) -> None:
    """Fail with one line naming `setting` if the port cannot be listened on."""
    if port is None:
        return
    if port == 0:
        raise ConfigurationError(
            f"{setting}=0 is not allowed (clients must know the port): set {setting} to a free port"
        )
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {host}:{port} ({exc.strerror}): check the host beside {setting}"
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigurationError(
                f"port {port} on {host} is not free ({exc.strerror}):"
                f" set {setting} to a free port, or stop what listens there"
            ) from None


def check_ports(settings: Settings, parts: Sequence[str]) -> None:
    """Every port the given parts ("api", "smtp", "flower", "metrics") will
    listen on, before anything starts."""
    wanted = {
        "api": (settings.api_host, settings.api_port, "SIGNALBOX_API_PORT"),
        "smtp": (settings.smtp_host, settings.smtp_port, "SIGNALBOX_SMTP_PORT"),
        "smtps": (settings.smtp_host, settings.smtps_port, "SIGNALBOX_SMTPS_PORT"),
        "flower": (settings.flower_host, settings.flower_port, "SIGNALBOX_FLOWER_PORT"),
        "metrics": (settings.metrics_host, settings.metrics_port, "SIGNALBOX_METRICS_PORT"),
    }
    for part in parts:
        host, port, setting = wanted[part]
        check_port(host, port, setting)
        if part == "smtp" and settings.smtps_port:
            check_port(*wanted["smtps"])


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn's worker processes, created with
    `IPPROTO_TCP`: asyncio sets TCP_NODELAY only on accepted sockets whose
    protocol says TCP, and uvicorn's own `bind_socket` leaves it 0, so every
    keep-alive response would wait ~40 ms for a delayed ACK (uvicorn #3149)."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
