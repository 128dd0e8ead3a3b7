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

from tests.stack_fixtures import ROOT, free_port, wait_until

pytestmark = pytest.mark.acceptance


def up(data: Path, ports: dict[str, int]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(
        {
            "SIGNALBOX_DATA_DIR": str(data),
            "SIGNALBOX_API_PORT": str(ports["api"]),
            "SIGNALBOX_SMTP_PORT": str(ports["smtp"]),
            "SIGNALBOX_EMBEDDED_REDIS_PORT": str(ports["redis"]),
            "SIGNALBOX_FLOWER_PORT": str(ports["flower"]),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", "up"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
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


def stop(proc: subprocess.Popen[str]) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=60)
    if proc.stdout is not None:
        proc.stdout.close()
    return code


def test_up_runs_the_whole_stack_on_the_embedded_default_and_keeps_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ports = {name: free_port() for name in ("api", "smtp", "redis", "flower")}
    proc = up(data, ports)
    try:
        banner = read_banner(proc)
        assert "Signalbox is up." in banner
        assert f"http://127.0.0.1:{ports['api']}" in banner
        assert f"127.0.0.1:{ports['smtp']}" in banner
        token = (data / "dev-token").read_text().strip()
        assert token in banner
        demo_env = {
            **os.environ,
            "SIGNALBOX_DATA_DIR": str(data),
            "SIGNALBOX_API_PORT": str(ports["api"]),
            "SIGNALBOX_SMTP_PORT": str(ports["smtp"]),
        }
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

    # Restart on the same data directory: the run's evidence is still there.
    proc = up(data, ports)
    try:
        read_banner(proc)
        headers = {"Authorization": f"Bearer {token}"}
        api = f"http://127.0.0.1:{ports['api']}"
        wait_until(lambda: httpx.get(f"{api}/readyz", timeout=5).status_code == 200, 30)
        evidence = httpx.get(f"{api}/v1/runs/{run_id}/evidence", headers=headers, timeout=10)
        assert evidence.status_code == 200
        assert evidence.json()["signals"][0]["status"] == "consumed"
    finally:
        assert stop(proc) == 0
