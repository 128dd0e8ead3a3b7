"""The ``signalbox`` CLI as a subprocess against the running stack, and its exit codes."""

from __future__ import annotations

import json
import socket
import subprocess
from typing import Any

import pytest
from live_helpers import cli_env, new_run_id, send_email, signalbox_bin

pytestmark = pytest.mark.acceptance


def cli(
    stack: Any, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [signalbox_bin(), *args],
        env=env or cli_env(stack),
        capture_output=True,
        text=True,
        timeout=90,
    )


def watch_new_mailbox(
    stack: Any, run_id: str, test_case: str, *options: str
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """``signalbox mailbox`` then ``signalbox watch`` on its address (``--json``):
    the address and the watch's result."""
    box = json.loads(cli(stack, "mailbox", "--run-id", run_id, "--json").stdout)
    watch = cli(
        stack,
        "watch",
        "--run-id",
        run_id,
        "--test-case",
        test_case,
        "--recipient",
        box["address"],
        *options,
        "--json",
    )
    return box["address"], watch


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_watch_wait_claim_consume_evidence_with_json(live_stack: Any) -> None:
    run_id = new_run_id("cli")
    address, watch = watch_new_mailbox(
        live_stack, run_id, "cli_roundtrip", "--subject-contains", "welcome"
    )
    assert watch.returncode == 0, watch.stderr
    signal_id = json.loads(watch.stdout)["signal_id"]

    send_email(
        live_stack,
        address,
        "Welcome aboard",
        "https://app.example.test/x",
        run_marker=run_id,
    )
    waited = cli(live_stack, "wait", signal_id, "--timeout", "60", "--json")
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["result"] == "found"
    assert waited.stderr == ""  # not a TTY: no spinner

    claimed = cli(live_stack, "claim", signal_id, "--run-id", run_id, "--json")
    assert claimed.returncode == 0, claimed.stderr
    claim = json.loads(claimed.stdout)
    assert claim["status"] == "claimed" and claim["links"] == ["https://app.example.test/x"]

    again = cli(live_stack, "claim", signal_id, "--run-id", run_id, "--json")
    assert again.returncode == 1
    assert json.loads(again.stdout)["status"] == "already_claimed"

    consumed = cli(live_stack, "consume", claim["claim_id"], "--json")
    assert consumed.returncode == 0, consumed.stderr
    receipt_id = json.loads(consumed.stdout)["receipt_id"]

    evidence = cli(live_stack, "evidence", run_id, "--json")
    assert evidence.returncode == 0
    assert receipt_id in evidence.stdout
    table = cli(live_stack, "evidence", run_id)
    assert table.returncode == 0 and receipt_id in table.stdout


def test_expired_wait_exits_1_with_the_reason(live_stack: Any) -> None:
    run_id = new_run_id("cli")
    _, watch = watch_new_mailbox(live_stack, run_id, "cli_expiry", "--expires-in", "2")
    signal_id = json.loads(watch.stdout)["signal_id"]
    waited = cli(live_stack, "wait", signal_id, "--timeout", "60")
    assert waited.returncode == 1
    assert "deadline" in waited.stderr


def test_unreachable_service_exits_3(live_stack: Any) -> None:
    env = cli_env(live_stack, SIGNALBOX_URL=f"http://127.0.0.1:{closed_port()}")
    result = cli(live_stack, "evidence", "any-run", env=env)
    assert result.returncode == 3
    assert "cannot reach" in result.stderr


def test_bad_arguments_exit_2(live_stack: Any) -> None:
    assert cli(live_stack, "watch", "--run-id", "r").returncode == 2
    assert cli(live_stack, "wait").returncode == 2


def test_invalid_input_rejected_by_the_server_exits_2(live_stack: Any) -> None:
    result = cli(
        live_stack,
        "watch",
        "--run-id",
        "bad run id!",
        "--test-case",
        "t",
        "--recipient",
        "a@sink.test",
    )
    assert result.returncode == 2
    assert "run_id" in result.stderr


def test_a_crafted_claim_id_cannot_release_the_claim(live_stack: Any) -> None:
    run_id = new_run_id("cli-hostile")
    address, watch = watch_new_mailbox(live_stack, run_id, "crafted_id")
    signal_id = json.loads(watch.stdout)["signal_id"]
    send_email(live_stack, address, "\x1b[2JYour login code", "Code 553311")
    assert cli(live_stack, "wait", signal_id, "--timeout", "60").returncode == 0
    claimed = cli(live_stack, "claim", signal_id, "--run-id", run_id)
    assert claimed.returncode == 0, claimed.stderr
    assert "\x1b" not in claimed.stdout  # the subject's escape sequence is stripped
    claim_id = next(
        line.split()[-1] for line in claimed.stdout.splitlines() if line.startswith("claim_id")
    )

    crafted = cli(live_stack, "consume", f"../claims/{claim_id}/release?x=")
    assert crafted.returncode == 2
    assert "not a claim id" in crafted.stderr
    still = json.loads(cli(live_stack, "wait", signal_id, "--timeout", "5", "--json").stdout)
    assert still["status"] == "claimed"
    assert still["claim"]["claim_id"] == claim_id
