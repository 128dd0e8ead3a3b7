"""What every server helper shares: loopback ports, waiting for a port,
stopping a server's process group, and the error a missing server raises."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run `bash scripts/install-test-deps.sh` (as root) to install it"
LOOPBACK = "127.0.0.1"


class MissingTestDependency(RuntimeError):
    """A server the tests need is not installed on this machine."""


# Where free_port looks when the suite runs on pytest-xdist workers: a block of
# its own per worker, below the kernel's ephemeral range (32768-60999 here and
# by default), so that no worker is handed a port another worker picked a
# moment ago, nor one the kernel gives an outgoing connection, and clear of
# the ports the machine's own servers use (RabbitMQ's 25672 among them).
PORT_BLOCK_START = 10000
PORT_BLOCK_SIZE = 1500
PORT_BLOCKS = 8  # up to 8 workers: 10000-21999


def _worker_index() -> int | None:
    """This pytest-xdist worker's number (gw3 -> 3), or None outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    if name.startswith("gw") and name[2:].isdigit():
        return int(name[2:]) % PORT_BLOCKS
    return None


def _block_ports() -> Iterator[int]:
    index = _worker_index()
    assert index is not None
    start = PORT_BLOCK_START + index * PORT_BLOCK_SIZE
    # Start where an earlier run on this worker number (whose ports may linger
    # in TIME_WAIT) most likely did not stop, then walk the block round.
    offset = os.getpid() % PORT_BLOCK_SIZE
    while True:
        for step in range(PORT_BLOCK_SIZE):
            yield start + (offset + step) % PORT_BLOCK_SIZE


_ports: Iterator[int] | None = None


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago.

    Alone, the OS picks it. On a pytest-xdist worker, the next port of the
    worker's own block that binds: two workers never pick the same port, and
    one worker does not reuse a port until it has walked its whole block."""
    global _ports
    if _worker_index() is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    if _ports is None:
        _ports = _block_ports()
    for _ in range(PORT_BLOCK_SIZE):
        port = next(_ports)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port left in this worker's block on {host}")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts connections on `host:port` right now."""
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def wait_for_port(
    host: str,
    port: int,
    timeout: float = 15.0,
    process: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
) -> None:
    """Wait until `host:port` accepts a connection.

    Fails at once, with the server's log, if `process` exits meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"server exited with code {process.returncode} before listening on "
                f"{host}:{port}{log_tail(log_path)}"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing listens on {host}:{port} after {timeout}s{log_tail(log_path)}"
                ) from None
            time.sleep(0.05)


def log_tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- {log_path} ---\n" + "\n".join(tail)


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Stop a server started with ``start_new_session=True``, with all its children.

    Dovecot's master, for one, exits on SIGTERM without waiting for its imap
    processes, which would keep serving open connections; signalling the
    whole process group (the server's own session) ends them too.
    """
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
