"""Loopback TCP proxies: one that counts connections, one that records what the
client sends after a slow start, one that delays bytes."""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import threading
import time
from typing import Self

from tests.servers.base import LOOPBACK


class _TcpProxy:
    """A loopback TCP proxy: accepts, connects each client to the target and
    relays (`_relay`, per subclass). A refused target closes the client."""

    def __init__(self, target_host: str, target_port: int, host: str, name: str) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._count = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"{name}-{self.port}", daemon=True
        )
        self._acceptor.start()

    @property
    def connections(self) -> int:
        """How many connections were accepted so far."""
        with self._lock:
            return self._count

    @property
    def url(self) -> str:
        """``http://host:port`` of the proxy, for HTTP targets."""
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        """Stop accepting and cut every open connection (pending bytes are dropped)."""
        self._stopping.set()
        self._listener.close()
        self.cut()
        self._acceptor.join(5)
        for thread in list(self._threads):
            thread.join(5)

    def cut(self) -> None:
        """Cut the open connections but keep accepting new ones."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                if not selector.select(timeout=0.1):
                    continue
                try:
                    client, _ = self._listener.accept()
                except OSError:
                    return
                with self._lock:
                    self._count += 1
                    self._sockets.add(client)
                    # Finished connections' threads are dropped as we go.
                    self._threads = [t for t in self._threads if t.is_alive()]
                thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
                self._threads.append(thread)
                thread.start()
        finally:
            selector.close()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((self.target_host, self.target_port), timeout=5)
        except OSError:
            self._forget(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.add(upstream)
        try:
            self._relay(client, upstream)
        finally:
            self._forget(client)
            self._forget(upstream)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


class CountingProxy(_TcpProxy):
    """A loopback TCP proxy that counts the connections it accepts.

    Put it between a client and a server to prove how many connections the
    client opened (e.g. none while a circuit breaker is open). Every
    accepted connection is counted, even if the target refuses it; the
    client then sees the connection closed.
    """

    def __init__(self, target_host: str, target_port: int, host: str = LOOPBACK) -> None:
        super().__init__(target_host, target_port, host, "counting-proxy")

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        try:
            while not self._stopping.is_set():
                for key, _ in selector.select(timeout=0.1):
                    source = key.fileobj
                    assert isinstance(source, socket.socket)
                    data = source.recv(65536)
                    if not data:
                        return
                    if source is client:
                        self._from_client(client, data)
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            selector.close()

    def _from_client(self, client: socket.socket, data: bytes) -> None:
        """Each chunk the client sends, before it is passed on."""


class RecordingProxy(CountingProxy):
    """A `CountingProxy` that starts every new connection `connect_delay`
    seconds late (nothing passes either way before) and records the lines
    the client sends (`lines`; an HTTP request's first line, an IMAP
    command). A reused connection is not slowed down, so the proxy shows
    what a client that opens a connection per request would pay::

        with RecordingProxy(maildev.host, maildev.web_port, connect_delay=3) as proxy:
            ...
            assert proxy.requests == ["/email", "/email/abc/source"]
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        connect_delay: float = 0.0,
        host: str = LOOPBACK,
    ) -> None:
        self.connect_delay = connect_delay
        self._lines: list[bytes] = []
        self._partial: dict[socket.socket, bytes] = {}
        super().__init__(target_host, target_port, host)

    @property
    def lines(self) -> list[bytes]:
        """Every complete line (without its line end) clients sent, in order."""
        with self._lock:
            return list(self._lines)

    @property
    def requests(self) -> list[str]:
        """The paths of the HTTP requests clients sent, in order."""
        paths: list[str] = []
        for line in self.lines:
            parts = line.split(b" ")
            if len(parts) == 3 and parts[2].startswith(b"HTTP/"):
                paths.append(parts[1].decode("ascii", "replace"))
        return paths

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        # Waits in slices so that `close()` is not held up by a long delay.
        deadline = time.monotonic() + self.connect_delay
        while not self._stopping.is_set() and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        super()._relay(client, upstream)

    def _from_client(self, client: socket.socket, data: bytes) -> None:
        with self._lock:
            pending = self._partial.pop(client, b"") + data
            *complete, rest = pending.split(b"\n")
            self._lines.extend(line.rstrip(b"\r") for line in complete)
            if rest:
                self._partial[client] = rest


class DelayingProxy(_TcpProxy):
    """A loopback TCP proxy that holds bytes back for a while before passing them on.

    Every chunk read from the server is written to the client `server_delay`
    seconds later (and client → server bytes `client_delay` seconds later).
    Both are plain attributes, read when each chunk arrives, so a test can
    slow a live provider down and speed it up again::

        with DelayingProxy(maildev.host, maildev.web_port) as slow:
            ...  # providers.toml points at slow.url
            slow.server_delay = 40  # every answer now takes 40 s more
            ...
            slow.server_delay = 0

    Chunks keep their order even when the delay shrinks, and a side's EOF is
    passed on (half-close) after its last delayed bytes. When the target
    refuses the connection, the client sees it closed, like `CountingProxy`.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        server_delay: float = 0.0,
        client_delay: float = 0.0,
        host: str = LOOPBACK,
    ) -> None:
        self.server_delay = server_delay
        self.client_delay = client_delay
        super().__init__(target_host, target_port, host, "delaying-proxy")

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        to_server = threading.Thread(
            target=self._pump, args=(client, upstream, "client_delay"), daemon=True
        )
        to_server.start()
        self._pump(upstream, client, "server_delay")
        to_server.join()

    def _pump(self, source: socket.socket, sink: socket.socket, delay_name: str) -> None:
        """Copy `source` to `sink`, each chunk `getattr(self, delay_name)` s late."""
        pending: collections.deque[tuple[float, bytes | None]] = collections.deque()
        last_due = 0.0
        reading = True
        selector = selectors.DefaultSelector()
        selector.register(source, selectors.EVENT_READ)
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                wait = 0.1 if not pending else min(0.1, max(0.0, pending[0][0] - now))
                if reading:
                    ready = selector.select(timeout=wait)
                else:
                    ready = []
                    time.sleep(wait)
                if ready:
                    data = source.recv(65536)
                    # Never before an earlier chunk: order survives a shrinking delay.
                    last_due = max(last_due, time.monotonic() + float(getattr(self, delay_name)))
                    pending.append((last_due, data or None))
                    reading = bool(data)
                now = time.monotonic()
                while pending and pending[0][0] <= now:
                    _, chunk = pending.popleft()
                    if chunk is None:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(chunk)
        except OSError:
            # One side is gone: cut the other too, like a dropped connection.
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        finally:
            selector.close()
