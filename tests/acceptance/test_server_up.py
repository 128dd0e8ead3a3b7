"""`signalbox-server up` as a user runs it (what `make run` does): the whole
stack on the embedded default, one demo flow, Ctrl-C, and data that survives
a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port
from tests.stack import ROOT, wait_until

pytestmark = pytest.mark.acceptance


def server_env(data: Path, ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(
        {
            "SIGNALBOX_DATA_DIR": str(data),
            "SIGNALBOX_API_PORT": str(ports["api"]),
            "SIGNALBOX_SMTP_PORT": str(ports["smtp"]),
            # Never the default 2465: another `up` on this machine may hold it.
            "SIGNALBOX_SMTPS_PORT": str(ports.get("smtps") or free_port()),
            "SIGNALBOX_EMBEDDED_REDIS_PORT": str(ports["redis"]),
            "SIGNALBOX_FLOWER_PORT": str(ports["flower"]),
            # One uvicorn process instead of one per core: lighter on a busy CI
            # machine; several API processes are tested in test_api_workers.
            "SIGNALBOX_API_WORKERS": "1",
            # One sink process for the same reason; several: test_up_sink_processes.
            "SIGNALBOX_SMTP_PROCESSES": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def up(data: Path, ports: dict[str, int]) -> subprocess.Popen[str]:
    # Its stderr in a file beside the data, to read when a test fails.
    with open(data.parent / "up-stderr.log", "ab") as stderr:
        return _popen_up(data, ports, stderr)


def _popen_up(data: Path, ports: dict[str, int], stderr: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "up"],
        cwd=ROOT,
        env=server_env(data, ports),
        stdout=subprocess.PIPE,
        stderr=stderr,  # type: ignore[arg-type]
        text=True,
        start_new_session=True,
    )


def read_banner(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("Ctrl-C"):
            break
    return "".join(lines)


def stderr_tail(tmp_path: Path, lines: int = 40) -> str:
    """The last lines `up` wrote to stderr in this test, for a failure's message."""
    path = tmp_path / "up-stderr.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return "up's stderr ends:\n" + "\n".join(text.splitlines()[-lines:])


def stop(proc: subprocess.Popen[str]) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=60)
    if proc.stdout is not None:
        proc.stdout.close()
    return code


@pytest.mark.timeout(480)
def test_up_runs_the_whole_stack_on_the_embedded_default_and_keeps_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ports = {name: free_port() for name in ("api", "smtp", "smtps", "redis", "flower")}
    proc = up(data, ports)
    try:
        banner = read_banner(proc)
        assert "Signalbox is up." in banner
        # Both SMTP ports: STARTTLS on the plain one, implicit TLS on the other.
        assert (
            f"SMTP sink  127.0.0.1:{ports['smtp']}  (STARTTLS, AUTH optional, 1 process)" in banner
        )
        assert f"SMTPS      127.0.0.1:{ports['smtps']}  (implicit TLS)" in banner
        # "up" means ready: /readyz answers 200 by the time the banner says so.
        assert ready(f"http://127.0.0.1:{ports['api']}")
        assert f"http://127.0.0.1:{ports['api']}" in banner
        assert f"127.0.0.1:{ports['smtp']}" in banner
        token = (data / "dev-token").read_text().strip()
        assert token in banner
        # What the banner says to export, and nothing of up's own settings
        # (no data directory with the dev token, no API port).
        exported = banner.split("export ")[1].splitlines()[0].split()
        demo_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")},
            **dict(pair.split("=", 1) for pair in exported),
            "SIGNALBOX_DATA_DIR": str(tmp_path / "elsewhere"),
        }
        # The SMTP port comes from the banner's export line too (not the default 2525).
        assert f"SIGNALBOX_SMTP_PORT={ports['smtp']}" in exported
        demo = subprocess.run(
            [sys.executable, "-m", "app.cli", "demo"],
            cwd=ROOT,
            env=demo_env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert "result found" in demo.stdout and "consumed: receipt rcp_" in demo.stdout
        run_id = demo.stdout.split("for run ")[1].split(":")[0]
        flower = httpx.get(f"http://127.0.0.1:{ports['flower']}/healthcheck", timeout=10)
        assert flower.status_code == 200
    finally:
        assert stop(proc) == 0
    quiet_start_and_stop(tmp_path / "up-stderr.log")

    # Restart on the same data directory: the run's evidence is still there.
    proc = up(data, ports)
    try:
        assert "Signalbox is up." in read_banner(proc), stderr_tail(tmp_path)
        headers = {"Authorization": f"Bearer {token}"}
        api = f"http://127.0.0.1:{ports['api']}"
        # Ready once every part answers (the worker's and beat's heartbeats included).
        try:
            wait_until(lambda: ready(api), 180, interval=0.5, what="/readyz 200 after the restart")
        except pytest.fail.Exception as failed:
            pytest.fail(f"{failed}; {stderr_tail(tmp_path)}")
        evidence = httpx.get(f"{api}/v1/runs/{run_id}/evidence", headers=headers, timeout=10)
        assert evidence.status_code == 200
        assert evidence.json()["signals"][0]["status"] == "consumed"

        # A part of `up` that stops answering makes /readyz 503 naming it.
        worker = child_running(proc.pid, "worker")
        os.kill(worker, signal.SIGSTOP)
        try:
            wait_until(
                lambda: "worker" in readyz_failing(api), 30, what="/readyz to name the worker"
            )
        finally:
            os.kill(worker, signal.SIGCONT)
        wait_until(lambda: readyz_failing(api) == [], 30, what="ready again")
    finally:
        assert stop(proc) == 0


def quiet_start_and_stop(stderr_log: Path) -> None:
    """What `up` printed on stderr from start to Ctrl-C: no warning that is
    noise on a developer's machine, no idle task, no traceback."""
    text = stderr_log.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert "SecurityWarning" not in text  # Celery's, when run as root
    assert "Inspect method" not in text  # Flower's, when no worker answers yet
    assert "webhook_due" not in text  # no webhook configured: no outbox task


def ready(api: str) -> bool:
    try:
        return httpx.get(f"{api}/readyz", timeout=10).status_code == 200
    except httpx.TransportError:
        return False  # still starting


def readyz_failing(api: str) -> list[str]:
    response = httpx.get(f"{api}/readyz", timeout=10)
    failing: list[str] = response.json()["failing"]
    assert (response.status_code == 503) == bool(failing)
    return failing


def child_running(pid: int, command: str) -> int:
    """The pid of the child of `pid` that runs `python -m app.cli <command>`."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for child in map(int, children):
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if command.encode() in argv:
            return child
    raise AssertionError(f"no {command} child of {pid}")


@pytest.mark.parametrize("command", ["up", "api", "smtp"])
def test_a_busy_port_fails_with_one_line_naming_the_setting(tmp_path: Path, command: str) -> None:
    import socket

    ports = {name: free_port() for name in ("api", "smtp", "redis", "flower")}
    busy = "smtp" if command == "smtp" else "api"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[busy]))
        holder.listen()
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", command],
            cwd=ROOT,
            env=server_env(tmp_path / "data", ports),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"SIGNALBOX_{busy.upper()}_PORT" in lines[0] and str(ports[busy]) in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_smtp_port_zero_is_refused_with_one_line(tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("api", "smtp", "redis", "flower")}
    env = server_env(tmp_path / "data", ports)
    env["SIGNALBOX_SMTP_PORT"] = "0"
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "up"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "SIGNALBOX_SMTP_PORT=0" in result.stderr
    assert "Traceback" not in result.stderr
