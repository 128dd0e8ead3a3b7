"""SIGNALBOX_SMTP_PROCESSES as a user meets it: a wrong value refuses to start
with one line naming it; `up` with two sink processes says so in its banner,
and a killed sink process is reported and replaced while mail keeps arriving."""

from __future__ import annotations

import os
import signal
import smtplib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.test_server_up import child_running, read_banner, server_env, stop
from tests.servers import free_port
from tests.stack import ROOT, wait_until

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("value", ["0", "x"])
@pytest.mark.parametrize("command", ["smtp", "up"])
def test_a_wrong_process_count_refuses_to_start_naming_the_setting(
    tmp_path: Path, command: str, value: str
) -> None:
    ports = {name: free_port() for name in ("api", "smtp", "redis", "flower")}
    env = server_env(tmp_path / "data", ports)
    env["SIGNALBOX_SMTP_PROCESSES"] = value
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "SIGNALBOX_SMTP_PROCESSES" in lines[0]
    assert ("greater than or equal to 1" if value == "0" else "valid integer") in lines[0]
    assert not (tmp_path / "data").exists()  # refused before anything started


def sink_processes(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [
        pid
        for pid in map(int, children)
        if b"--process" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    ]


def deliver(port: int) -> int:
    with smtplib.SMTP("127.0.0.1", port, timeout=60) as smtp:
        refused = smtp.sendmail(
            "app@example.test", ["someone@example.test"], b"Subject: hi\r\n\r\nhi\r\n"
        )
    return 0 if not refused else 1


@pytest.mark.timeout(300)
def test_up_runs_two_sink_processes_and_replaces_a_killed_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ports = {name: free_port() for name in ("api", "smtp", "smtps", "redis", "flower")}
    stderr_log = tmp_path / "up-stderr.log"
    proc = _up_with_two_sinks(data, ports, stderr_log)
    try:
        banner = read_banner(proc)
        assert f"127.0.0.1:{ports['smtp']}  (STARTTLS, AUTH optional, 2 processes)" in banner
        supervisor = child_running(proc.pid, "smtp")
        first = sink_processes(supervisor)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        wait_until(
            lambda: len(set(sink_processes(supervisor)) - set(first)) == 1,
            60,
            what="a new sink process",
        )
        assert proc.poll() is None  # `up` runs on
        # The supervisor reports the restart just after it spawns the new
        # process, so the child can be seen before the line is written.
        reported = f"smtp process 1/2 (pid {first[0]}) exited with -9; restarted as pid"
        wait_until(lambda: reported in stderr_log.read_text(), 30, what="the restart report")
        wait_until(lambda: deliver(ports["smtp"]) == 0, 30, what="a delivery after the restart")
    finally:
        assert stop(proc) == 0


def _up_with_two_sinks(
    data: Path, ports: dict[str, int], stderr_path: Path
) -> subprocess.Popen[str]:
    env = server_env(data, ports)
    env["SIGNALBOX_SMTP_PROCESSES"] = "2"
    with open(stderr_path, "ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "app.cli", "up", "--no-flower"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
