"""The SMTP sink cannot be locked out by connections that hold their place.

Each attack runs against the real `smtp` process of a stack over real
sockets, with small limits so the tests are quick; every timing bound is
generous (a reply is waited for, never slept for).
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest

from tests.integration.helpers import mail
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

IDLE_REPLY = "421 4.4.2 Idle too long; closing connection"
# Far more than any limit below: a reply waited for longer is a failure.
READ_TIMEOUT = 60.0


class Client:
    """One raw SMTP connection: write lines, read replies (never smtplib's
    retries or timeouts in the way)."""

    def __init__(self, stack: Stack, source: str = "127.0.0.1", rcvbuf: int = 0) -> None:
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(READ_TIMEOUT)
        self.sock.bind((source, 0))
        self.sock.connect((stack.smtp_host, stack.smtp_port))
        self.lines = self.sock.makefile("rb")

    def reply(self) -> str:
        """The next reply (its last line), or "" if the sink closed the connection."""
        while True:
            line = self.lines.readline().decode("ascii", "replace").rstrip("\r\n")
            if len(line) < 4 or line[3] != "-":
                return line

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode("ascii") + b"\r\n")

    def command(self, line: str) -> str:
        self.send(line)
        return self.reply()

    def closed_by_sink(self) -> bool:
        return self.lines.read() == b""  # EOF (after any bytes left), within READ_TIMEOUT

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


@pytest.fixture
def sink(stack_factory: Callable[..., Stack]) -> Callable[..., Stack]:
    """Start a stack's SMTP sink with these settings (`smtp_idle_seconds="2"`)."""

    def start(**settings: str) -> Stack:
        env = {f"SIGNALBOX_{key.upper()}": value for key, value in settings.items()}
        stack = stack_factory(env)
        stack.start_smtp()
        return stack

    return start


def greeted(stack: Stack, source: str = "127.0.0.1", rcvbuf: int = 0) -> Client:
    """A connection the sink greeted with 220. The sink's start-up probe, or
    a connection just closed, may still hold a place for a moment: a 421
    then is retried."""

    def attempt() -> Client | None:
        client = Client(stack, source, rcvbuf)
        if client.reply().startswith("220 "):
            return client
        client.close()
        return None

    client: Client = wait_until(attempt, 30, what="a 220 greeting")
    return client


def deliver(client: Client, pause: float = 0.0) -> None:
    """Send one message on a greeted connection, a line every `pause` seconds; expect 250."""
    recipient = f"limits-{uuid.uuid4().hex[:8]}@example.test"
    assert client.command("EHLO client.test").startswith("250 ")
    assert client.command("MAIL FROM:<app@example.test>").startswith("250 ")
    assert client.command(f"RCPT TO:<{recipient}>").startswith("250 ")
    assert client.command("DATA").startswith("354 ")
    body = "a line of a message sent slowly\n" * 30
    for line in mail(recipient, body=body).decode().splitlines():
        client.send("." + line if line.startswith(".") else line)
        time.sleep(pause)
    assert client.command(".").startswith("250 ")
    assert client.command("QUIT").startswith("221 ")


def test_connections_that_never_send_a_command_are_closed_and_free_the_sink(
    sink: Callable[..., Stack],
) -> None:
    # Between commands 40 s; before the first command min(10, 40) = 10 s.
    stack = sink(smtp_max_connections="4", smtp_idle_seconds="40")
    started = time.monotonic()
    idle = [greeted(stack) for _ in range(4)]
    try:
        locked_out = Client(stack)
        assert locked_out.reply().startswith("421 ")  # the sink is full
        locked_out.close()
        assert [client.reply() for client in idle] == [IDLE_REPLY] * 4
        waited = time.monotonic() - started
        assert all(client.closed_by_sink() for client in idle)
    finally:
        for client in idle:
            client.close()
    # The pre-command limit, not the between-commands one, closed them.
    assert 9.0 <= waited < 35.0
    fifth = greeted(stack)  # a fifth client gets in and delivers
    try:
        deliver(fifth)
    finally:
        fifth.close()


def test_a_client_idle_between_commands_gets_421(sink: Callable[..., Stack]) -> None:
    stack = sink(smtp_idle_seconds="2")
    client = greeted(stack)
    try:
        assert client.command("EHLO attacker.test").startswith("250 ")
        assert client.command("MAIL FROM:<a@example.test>").startswith("250 ")
        quiet_since = time.monotonic()
        assert client.reply() == IDLE_REPLY
        assert 1.5 <= time.monotonic() - quiet_since < 30.0
        assert client.closed_by_sink()
    finally:
        client.close()


def test_a_client_that_keeps_sending_commands_is_not_idle(sink: Callable[..., Stack]) -> None:
    stack = sink(smtp_idle_seconds="3")
    client = greeted(stack)
    try:
        assert client.command("EHLO busy.test").startswith("250 ")
        began = time.monotonic()
        while time.monotonic() - began < 8:  # well past the limit, a command every 0.3 s
            time.sleep(0.3)
            assert client.command("NOOP").startswith("250 ")
    finally:
        client.close()


def test_one_address_takes_at_most_its_share_of_connections(sink: Callable[..., Stack]) -> None:
    stack = sink(smtp_max_connections="64", smtp_max_connections_per_ip="16")
    held = [greeted(stack) for _ in range(16)]
    try:
        seventeenth = Client(stack)
        assert seventeenth.reply().startswith("421 ")
        assert seventeenth.closed_by_sink()
        seventeenth.close()
        other = Client(stack, source="127.0.0.2")  # another client address still gets in
        assert other.reply().startswith("220 ")
        other.close()
        # A place given back is taken again.
        held.pop().close()
        held.append(greeted(stack))
    finally:
        for client in held:
            client.close()


def test_a_slow_but_steady_message_is_not_cut_as_idle(sink: Callable[..., Stack]) -> None:
    stack = sink(smtp_idle_seconds="3")
    client = greeted(stack)
    try:
        began = time.monotonic()
        deliver(client, pause=0.25)  # a line every 0.25 s, 36 lines: far past 3 s in all
        assert time.monotonic() - began > 2 * 3
    finally:
        client.close()


def test_a_slow_store_is_not_the_clients_idleness(sink: Callable[..., Stack]) -> None:
    """While the sink stores a message (here: blocked on a table lock for
    three idle limits) the client waits on the sink: it gets its 250, not a
    421 with its message stored behind its back."""
    stack = sink(smtp_idle_seconds="2", db_lock_timeout_ms="60000")
    recipient = f"stalled-{uuid.uuid4().hex[:8]}@example.test"
    client = greeted(stack)
    try:
        assert client.command("EHLO client.test").startswith("250 ")
        assert client.command("MAIL FROM:<app@example.test>").startswith("250 ")
        assert client.command(f"RCPT TO:<{recipient}>").startswith("250 ")
        assert client.command("DATA").startswith("354 ")
        for line in mail(recipient).decode().splitlines():
            client.send("." + line if line.startswith(".") else line)
        with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as lock:
            lock.execute("LOCK TABLE sink_messages IN EXCLUSIVE MODE")
            client.send(".")
            wait_until(lambda: store_waits_on_lock(stack), 30, what="the store to wait")
            time.sleep(3 * 2)  # the store stays blocked past the idle limit
            lock.rollback()
        assert client.reply().startswith("250 ")
    finally:
        client.close()


def store_waits_on_lock(stack: Stack) -> bool:
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query ILIKE '%sink_messages%'"
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_client_that_reads_no_reply_loses_its_place(sink: Callable[..., Stack]) -> None:
    """Pipelined commands whose replies are never read fill the socket, so
    the sink's 421 cannot be sent: the connection is cut all the same."""
    stack = sink(smtp_max_connections="1", smtp_idle_seconds="2")
    deaf = greeted(stack, rcvbuf=4096)
    try:
        deaf.sock.settimeout(2.0)
        burst = b"HELP\r\n" * 10_000
        with contextlib.suppress(OSError):  # a timeout: both directions are full
            while True:
                deaf.sock.sendall(burst)
        # The one place comes free while the deaf client still holds its socket.
        client = greeted(stack)
        assert client.command("QUIT").startswith("221 ")
        client.close()
    finally:
        deaf.close()
