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


def test_cancel_ends_a_waiting_signal_and_a_wait_on_it_exits_1(
    live_stack: Any,
) -> None:
    run_id = new_run_id("cli")
    _, watch = watch_new_mailbox(live_stack, run_id, "cli_cancel")
    signal_id = json.loads(watch.stdout)["signal_id"]
    done = cli(live_stack, "cancel", signal_id, "--reason", "test_failed")
    assert done.returncode == 0, done.stderr
    assert "cancel_reason" in done.stdout and "test_failed" in done.stdout
    again = cli(live_stack, "cancel", signal_id, "--json")
    assert again.returncode == 0
    view = json.loads(again.stdout)
    assert (view["status"], view["cancellation"]["reason"]) == ("cancelled", "test_failed")
    # A wait on it ends at once, refused (exit 1), naming the reason.
    waited = cli(live_stack, "wait", signal_id)
    assert waited.returncode == 1 and "cancelled (test_failed)" in waited.stderr
    bad = cli(live_stack, "cancel", signal_id, "--reason", "")
    assert bad.returncode == 2, bad.stderr


def _dead_letters_of(stack: Any, run_id: str, count: int) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + 60
    while True:
        listed = cli(stack, "dlq", "list", "--run-id", run_id, "--state", "open", "--json")
        items = json.loads(listed.stdout)["items"]
        if len(items) >= count or time.monotonic() > deadline:
            return items
        time.sleep(0.5)


def test_dlq_filters_by_run_and_test_case_and_acts_in_bulk(live_stack: Any) -> None:
    run_id, other_run = new_run_id("dlq"), new_run_id("dlq")
    for run, case in (
        (run_id, "e2e/test_signup.py::test_a"),
        (run_id, "e2e/test_b.py::test_b"),
        (other_run, "e2e/test_signup.py::test_a"),
    ):
        _, watch = watch_new_mailbox(live_stack, run, case, "--expires-in", "1")
        assert watch.returncode == 0, watch.stderr
    assert len(_dead_letters_of(live_stack, run_id, 2)) == 2
    assert len(_dead_letters_of(live_stack, other_run, 1)) == 1

    table = cli(live_stack, "dlq", "list", "--run-id", run_id)
    assert table.returncode == 0, table.stderr
    assert "TEST_CASE" in table.stdout and "WHY" in table.stdout
    assert "e2e/test_signup.py::test_a" in table.stdout and "e2e/test_b.py::test_b" in table.stdout
    one = json.loads(
        cli(
            live_stack,
            "dlq",
            "list",
            "--run-id",
            run_id,
            "--test-case",
            "e2e/test_b.py::test_b",
            "--json",
        ).stdout
    )["items"]
    assert [(d["test_case"], d["why"]) for d in one] == [("e2e/test_b.py::test_b", "none")]

    # Neither an id nor a filter, or both: a usage error, nothing moved.
    assert cli(live_stack, "dlq", "redrive").returncode == 2
    assert (
        cli(
            live_stack,
            "dlq",
            "discard",
            one[0]["dead_letter_id"],
            "--run-id",
            run_id,
            "--note",
            "x",
        ).returncode
        == 2
    )

    redriven = cli(
        live_stack,
        "dlq",
        "redrive",
        "--run-id",
        run_id,
        "--test-case",
        "e2e/test_b.py::test_b",
        "--expires-in",
        "60",
        "--json",
    )
    assert redriven.returncode == 0, redriven.stderr
    assert json.loads(redriven.stdout)["dead_letter_ids"] == [one[0]["dead_letter_id"]]
    discarded = cli(live_stack, "dlq", "discard", "--run-id", run_id, "--note", "known flake")
    assert discarded.returncode == 0 and discarded.stdout.startswith("discarded 1"), discarded
    # The other run's dead letter was left alone.
    assert len(_dead_letters_of(live_stack, other_run, 1)) == 1

    gone = json.loads(
        cli(live_stack, "dlq", "list", "--run-id", run_id, "--state", "discarded", "--json").stdout
    )["items"]
    shown = cli(live_stack, "dlq", "show", gone[0]["dead_letter_id"])
    assert shown.returncode == 0 and "known flake" in shown.stdout
    assert "discarded" in shown.stdout
