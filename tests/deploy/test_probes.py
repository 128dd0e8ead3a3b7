"""`signalbox-server probe worker|beat`: the liveness answer of a pod, from the
heartbeat files the worker's consumer and beat keep fresh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.stack import ROOT, Stack, wait_until

pytestmark = pytest.mark.integration


def probe(env: dict[str, str], part: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "probe", part, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("part", ["worker", "beat"])
def test_probe_says_alive_while_the_part_runs_and_not_when_it_never_ran(
    stack: Stack, tmp_path: Path, part: str
) -> None:
    heartbeats = Path(stack.env["SIGNALBOX_DATA_DIR"]) / "heartbeats"
    wait_until(lambda: list(heartbeats.glob(f"{part}-*")), 30, what=f"a {part} heartbeat")
    alive = probe(stack.env, part)
    assert alive.returncode == 0, alive.stdout + alive.stderr
    assert "alive" in alive.stdout

    # Another data directory: no such process there.
    elsewhere = {**stack.env, "SIGNALBOX_DATA_DIR": str(tmp_path)}
    dead = probe(elsewhere, part)
    assert dead.returncode == 1
    assert "no heartbeat" in dead.stdout


def test_probe_fails_once_the_heartbeat_is_older_than_the_limit(stack: Stack) -> None:
    heartbeats = Path(stack.env["SIGNALBOX_DATA_DIR"]) / "heartbeats"
    wait_until(lambda: list(heartbeats.glob("worker-*")), 30, what="a worker heartbeat")
    # A limit shorter than the time since any heartbeat could have been written.
    stale = probe(stack.env, "worker", "--max-age", "0.000001")
    assert stale.returncode == 1
    assert "last heartbeat" in stale.stdout
