"""`Stack`: Signalbox's real processes (`python -m app.cli api|smtp|worker|beat|up`)
for a test or a benchmark, each in its own session, each logging to a file.

The tests build one per test or per session (`tests/stack_fixtures.py`)
against their PostgreSQL and Redis (`base_env`); the benchmarks run
`signalbox-server up` through it (`bench/_stack.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.servers import LOOPBACK, free_port, port_open

ROOT = Path(__file__).resolve().parents[1]
TOKENS = {"default": "tok-default-0123456789", "other": "tok-other-0123456789"}


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


# Addresses on this domain are shared by every namespace of a test stack.
SHARED_DOMAIN = "shared.example.test"


def base_env(database_url: str, broker_url: str, data_dir: Path) -> dict[str, str]:
    """The environment of a test's processes: this process's, without its
    SIGNALBOX_* variables, plus the test's services, tokens and short intervals."""
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
            # One sink process (the default is one per core): lighter on a
            # busy machine; several are tested in test_sink_processes.
            "SIGNALBOX_SMTP_PROCESSES": "1",
            # Fixed QA inboxes every namespace may watch at once (no privacy).
            "SIGNALBOX_SHARED_ADDRESSES": f"@{SHARED_DOMAIN}",
            "PYTHONUNBUFFERED": "1",
            "C_FORCE_ROOT": "1",
        }
    )
    return env


@dataclass
class Stack:
    """Signalbox's processes, by name; `logs/<name>.log` holds each one's output.

    `env` is every process's environment (SIGNALBOX_API_PORT and
    SIGNALBOX_SMTP_PORT are added from `api_port` and `smtp_port`). `stop()`
    ends them all, with their children.
    """

    env: dict[str, str]
    logs: Path
    api_port: int = field(default_factory=free_port)
    smtp_port: int = field(default_factory=free_port)
    smtps_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Worker name -> its Celery node name (to address it with remote control).
    nodes: dict[str, str] = field(default_factory=dict)
    _log_files: list[IO[bytes]] = field(default_factory=list)
    token: str = TOKENS["default"]
    smtp_host: str = LOOPBACK

    @property
    def api_url(self) -> str:
        return f"http://{LOOPBACK}:{self.api_port}"

    @property
    def data_dir(self) -> Path:
        """SIGNALBOX_DATA_DIR of the processes."""
        return Path(self.env["SIGNALBOX_DATA_DIR"])

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(self.env)
        env.update(
            {
                "SIGNALBOX_API_PORT": str(self.api_port),
                "SIGNALBOX_SMTP_PORT": str(self.smtp_port),
                "SIGNALBOX_SMTPS_PORT": str(self.smtps_port),
            }
        )
        env.update(extra or {})
        return env

    # -- starting ---------------------------------------------------------------

    def spawn(
        self, name: str, args: list[str], extra_env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `python -m app.cli ARGS` as process `name`, in a session of its own."""
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

    def wait_for(
        self, what: str, predicate: Callable[[], object], timeout: float, process: str | None = None
    ) -> None:
        """Poll `predicate` until it is true; RuntimeError (with its log) as soon
        as `process` exits, TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self.procs.get(process) if process else None
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(
                    f"{process} exited with {proc.returncode} while waiting for {what}:\n"
                    + self.log_tail(process)
                )
            if predicate():
                return
            if time.monotonic() > deadline:
                tail = self.log_tail(process) if process else ""
                raise TimeoutError(f"{what} not ready after {timeout:.0f} s\n{tail}")
            time.sleep(0.05)

    def api_ready(self) -> bool:
        """Whether the API answers GET /healthz with 200."""
        try:
            return httpx.get(f"{self.api_url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_api(self) -> None:
        self.spawn("api", ["api"])
        self.wait_api()

    def wait_api(self) -> None:
        self.wait_for("the API to answer", self.api_ready, 120, process="api")

    def start_smtp(self) -> None:
        self.spawn("smtp", ["smtp"])
        self.wait_smtp()

    def wait_smtp(self) -> None:
        self.wait_for("the SMTP sink", lambda: port_open(self.smtp_port), 120, process="smtp")

    def spawn_worker(
        self,
        name: str = "worker",
        *,
        concurrency: int = 2,
        queues: str = "signals,dead_letter",
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        node = f"{name}-{free_port()}@{socket.gethostname()}"
        self.nodes[name] = node
        return self.spawn(
            name,
            ["worker", "--concurrency", str(concurrency), "--queues", queues, "--name", node],
            extra_env,
        )

    def wait_worker(self, name: str = "worker") -> None:
        log_path = self.logs / f"{name}.log"
        self.wait_for(
            f"worker {name} to be ready", lambda: b" ready." in log_path.read_bytes(), 120, name
        )

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

    def start(
        self,
        *,
        smtp: bool = True,
        worker: bool = True,
        beat: bool = True,
        worker_queues: str = "signals,dead_letter",
    ) -> Stack:
        """Start the API and the chosen processes in parallel, then wait until
        each answers (beat is not waited for: it serves nothing)."""
        self.spawn("api", ["api"])
        if smtp:
            self.spawn("smtp", ["smtp"])
        if worker:
            self.spawn_worker(queues=worker_queues)
        if beat:
            self.start_beat()
        self.wait_api()
        if smtp:
            self.wait_smtp()
        if worker:
            self.wait_worker()
        return self

    # -- stopping ---------------------------------------------------------------

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to process `name` and its children, and wait for it."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=20)

    def interrupt(self, name: str, sig: int = signal.SIGINT, timeout: float = 60) -> bool:
        """Send `sig` to process `name` alone (its own shutdown stops its
        children) and wait up to `timeout` s: whether it exited."""
        proc = self.procs[name]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        """SIGTERM every process's group, SIGKILL what is left of it after 10 s."""
        # A group outlives its leader when the leader ended first (`up`
        # interrupted, a worker killed alone): every group is signalled.
        for proc in self.procs.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            while _signal_group(proc.pid, 0) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _signal_group(proc.pid, signal.SIGKILL):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        for f in self._log_files:
            f.close()

    # -- using ------------------------------------------------------------------

    def log_text(self, name: str | None = None) -> str:
        """The log of process `name`, or of every process."""
        paths = [self.logs / f"{name}.log"] if name else sorted(self.logs.glob("*.log"))
        return "\n".join(p.read_text(errors="replace") for p in paths if p.exists())

    def log_tail(self, name: str, lines: int = 40) -> str:
        """The last `lines` lines of process `name`'s log."""
        return "\n".join(self.log_text(name).splitlines()[-lines:])

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


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` (0: none) to process group `pgid`: whether a member of it
    still runs. Zombies do not count: an orphan is not always reaped here."""
    members = _running_members(pgid)
    if members and sig:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    return bool(members)


def _running_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # After the command name (in parentheses, may hold spaces): state, ppid, pgrp.
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members
