"""SIGNALBOX_SMTP_PROCESSES=2: two sink processes share the SMTP port
(SO_REUSEPORT), both take connections, and parallel deliveries stay durable
(every 250 a committed row) with each waiting signal found exactly once."""

from __future__ import annotations

import contextlib
import os
import re
import smtplib
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.helpers import create_signal, db_rows, mail, wait_result
from tests.integration.test_metrics import sample_sum, scrape
from tests.servers import free_port
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

LISTEN, ESTABLISHED = "0A", "01"


def sockets_on(port: int) -> dict[int, set[str]]:
    """pid -> the TCP states of the sockets it holds whose local port is `port`."""
    states = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(f":{port:04X}"):
                    states[fields[9]] = fields[3]
    held: dict[int, set[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    inode = target[8:-1] if target.startswith("socket:[") else ""
                    if inode in states:
                        held.setdefault(int(pid), set()).add(states[inode])
    return held


def listeners(port: int) -> set[int]:
    return {pid for pid, states in sockets_on(port).items() if LISTEN in states}


@pytest.fixture
def two_sinks(stack_factory: Callable[..., Stack]) -> Stack:
    stack = stack_factory(
        {
            "SIGNALBOX_SMTP_PROCESSES": "2",
            # The per-address cap holds per sink process; these tests open
            # more sessions from one address than one process would take.
            "SIGNALBOX_SMTP_MAX_CONNECTIONS_PER_IP": "64",
        }
    )
    stack.start()
    wait_until(lambda: len(listeners(stack.smtp_port)) == 2, 60, what="two sink listeners")
    return stack


def test_two_sink_processes_listen_on_both_ports_and_both_take_connections(
    two_sinks: Stack,
) -> None:
    supervisor = two_sinks.procs["smtp"].pid
    plain = listeners(two_sinks.smtp_port)
    assert len(plain) == 2 and supervisor not in plain
    assert listeners(two_sinks.smtps_port) == plain
    # The kernel spreads connections by their address and port: of 24, each
    # process takes some (all on one: a chance of 2 in 2^24).
    sessions = [
        smtplib.SMTP(two_sinks.smtp_host, two_sinks.smtp_port, timeout=30) for _ in range(24)
    ]
    try:
        for session in sessions:
            assert session.ehlo()[0] == 250
        serving = {
            pid
            for pid, states in sockets_on(two_sinks.smtp_port).items()
            if ESTABLISHED in states and pid in plain
        }
        assert serving == plain
    finally:
        for session in sessions:
            session.quit()


def test_parallel_deliveries_to_two_sink_processes_are_durable_and_found_once(
    two_sinks: Stack,
) -> None:
    run = f"run-{uuid.uuid4().hex[:8]}"
    signals = {}
    for i in range(16):
        recipient = f"cores-{i}-{uuid.uuid4().hex[:6]}@example.test"
        signals[recipient] = create_signal(two_sinks, run_id=run, recipient=recipient)["signal_id"]
    # Each watched address gets its message, and an unwatched one beside it.
    targets = [*signals, *(f"nobody-{i}-{uuid.uuid4().hex[:6]}@example.test" for i in range(16))]

    def deliver(recipient: str) -> tuple[str, int, bytes]:
        # A connection per message: the deliveries spread over both processes.
        with smtplib.SMTP(two_sinks.smtp_host, two_sinks.smtp_port, timeout=60) as smtp:
            smtp.ehlo()
            assert smtp.mail("app@example.test")[0] == 250
            assert smtp.rcpt(recipient)[0] == 250
            code, reply = smtp.data(mail(recipient, run=run))
        return recipient, code, reply

    with ThreadPoolExecutor(8) as pool:
        sent = list(pool.map(deliver, targets))
    assert {code for _, code, _ in sent} == {250}
    queued = {}
    for recipient, _, reply in sent:
        found = re.search(rb"queued as (\d+)", reply)
        assert found is not None, reply
        queued[int(found.group(1))] = recipient
    rows = db_rows(
        two_sinks,
        "SELECT id, envelope_recipients FROM sink_messages WHERE id = ANY(%s)",
        list(queued),
    )
    assert {row[0]: row[1] for row in rows} == {k: [v] for k, v in queued.items()}

    message_ids = set()
    for recipient, signal_id in signals.items():
        view = wait_result(two_sinks, signal_id)
        assert view["status"] == "found", view
        assert view["message"]["recipient"] == recipient
        message_ids.add(view["message"]["message_id"])
    assert len(message_ids) == len(signals)
    matched = db_rows(
        two_sinks,
        "SELECT signal_id, count(*) FROM checks WHERE outcome = 'matched'"
        " AND signal_id = ANY(%s) GROUP BY signal_id",
        list(signals.values()),
    )
    assert sorted(count for _, count in matched) == [1] * len(signals)


def test_the_sink_supervisor_serves_the_counters_of_both_sink_processes(
    stack_factory: Callable[..., Stack],
) -> None:
    """With SIGNALBOX_METRICS_PORT the supervisor serves its tree's counters:
    refusals counted by either sink process add up, each counted once."""
    stack = stack_factory(
        {
            "SIGNALBOX_SMTP_PROCESSES": "2",
            "SIGNALBOX_SMTP_DOMAINS": "example.test",
            "SIGNALBOX_SMTP_MAX_CONNECTIONS_PER_IP": "64",
        }
    )
    port = free_port()
    stack.spawn("smtp", ["smtp"], {"SIGNALBOX_METRICS_PORT": str(port)})
    wait_until(lambda: len(listeners(stack.smtp_port)) == 2, 60, what="two sink listeners")
    sinks = listeners(stack.smtp_port)
    sessions = [smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) for _ in range(24)]
    try:
        for session in sessions:
            session.ehlo()
            session.mail("app@example.test")
            assert session.rcpt("someone@elsewhere.test")[0] == 550
    finally:
        for session in sessions:
            session.quit()

    def refused() -> float:
        families = scrape(f"http://127.0.0.1:{port}/metrics")
        return sample_sum(
            families,
            "signalbox_smtp_refused",
            "signalbox_smtp_refused_total",
            reason="recipient_domain",
        )

    # The port serves the sum, and both processes counted some (their own files).
    wait_until(lambda: refused() >= 24, 20, what="24 refusals counted")
    assert refused() == 24
    counted = {int(f.stem.rpartition("_")[2]) for f in _tree_files(stack, port)}
    assert sinks <= counted


def _tree_files(stack: Stack, port: int) -> list[Path]:
    """The counter files of the sink's metrics directory (its process tree's)."""
    supervisor = stack.procs["smtp"].pid
    tree = stack.data_dir / "metrics" / f"process-{supervisor}"
    return sorted(tree.glob("counter_*.db"))
