"""ImapProvider against a real Dovecot (see tests/servers.py)."""

from __future__ import annotations

import imaplib
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.errors import ProviderRejected, ProviderUnavailable
from app.providers.base import SearchQuery
from app.providers.imap import ImapProvider
from tests.servers import DovecotServer, RecordingProxy, free_port

pytestmark = [pytest.mark.integration, pytest.mark.providers]


@pytest.fixture
def provider(dovecot: DovecotServer) -> Iterator[ImapProvider]:
    imap = _provider(dovecot)
    yield imap
    imap.close()


def _provider(
    server: DovecotServer, password: str | None = None, folder: str = "INBOX"
) -> ImapProvider:
    return ImapProvider(
        name="test-imap",
        host=server.host,
        port=server.port,
        tls=False,
        username=server.username,
        password=server.password if password is None else password,
        folder=folder,
    )


def _raw(subject: str, to: str = "someone@example.test") -> bytes:
    return (
        f"From: app@example.test\r\nTo: {to}\r\nSubject: {subject}\r\n"
        f"Message-ID: <{subject.replace(' ', '-')}@example.test>\r\n\r\n"
        f"Body of {subject}.\r\n"
    ).encode()


def test_message_appended_after_since_is_returned_with_its_raw_bytes_and_a_stable_id(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    delivered = since + timedelta(minutes=2)
    raw = _raw("welcome code")
    uid = dovecot.append(raw, delivered)

    first = provider.search(SearchQuery(since=since))
    second = provider.search(SearchQuery(since=since))

    assert [m.provider_message_id for m in first] == [f"{dovecot.uidvalidity()}:{uid}"]
    assert [m.provider_message_id for m in second] == [m.provider_message_id for m in first]
    message = first[0]
    assert message.raw.replace(b"\r\n", b"\n") == raw.replace(b"\r\n", b"\n")
    assert message.received_at == delivered
    assert message.received_at.tzinfo is not None


def test_message_appended_before_since_is_not_returned_even_on_the_same_day(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    since = datetime.now(UTC).replace(microsecond=0)
    dovecot.append(_raw("too early"), since - timedelta(seconds=1))
    dovecot.append(_raw("yesterday"), since - timedelta(days=1, hours=1))
    dovecot.append(_raw("just in time"), since)

    found = provider.search(SearchQuery(since=since))

    assert [_subject(m.raw) for m in found] == ["just in time"]


def test_messages_come_oldest_first_with_received_at_in_utc(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    # Appended out of order, with an INTERNALDATE in another time zone.
    dovecot.append(_raw("second"), base + timedelta(minutes=20))
    plus_one = timezone(timedelta(hours=1))
    dovecot.append(_raw("first"), (base + timedelta(minutes=10)).astimezone(plus_one))

    found = provider.search(SearchQuery(since=base))

    assert [_subject(m.raw) for m in found] == ["first", "second"]
    assert found[0].received_at == base + timedelta(minutes=10)
    assert found[0].received_at.utcoffset() == timedelta(0)


def test_search_does_not_mark_messages_as_seen(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    since = datetime.now(UTC) - timedelta(minutes=1)
    uid = dovecot.append(_raw("unread stays unread"))

    assert len(provider.search(SearchQuery(since=since))) == 1

    conn = imaplib.IMAP4(dovecot.host, dovecot.port, timeout=10)
    conn.login(dovecot.username, dovecot.password)
    conn.select("INBOX", readonly=True)
    _, data = conn.uid("FETCH", str(uid), "(FLAGS)")
    conn.logout()
    flags = data[0]
    assert isinstance(flags, bytes)
    assert b"\\Seen" not in flags


def test_new_mail_is_seen_on_the_reused_connection(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    since = datetime.now(UTC) - timedelta(minutes=1)
    assert provider.search(SearchQuery(since=since)) == []

    dovecot.append(_raw("arrived later"))

    assert [_subject(m.raw) for m in provider.search(SearchQuery(since=since))] == ["arrived later"]


def test_wrong_password_is_rejected_as_auth_failed(dovecot: DovecotServer) -> None:
    imap = _provider(dovecot, password="not-the-password")

    with pytest.raises(ProviderRejected) as raised:
        imap.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "auth_failed"
    assert raised.value.transient is False
    assert "not-the-password" not in str(raised.value)


def test_missing_folder_is_rejected(dovecot: DovecotServer) -> None:
    imap = _provider(dovecot, folder="No Such Folder")

    with pytest.raises(ProviderRejected) as raised:
        imap.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "folder_not_found"


def test_stopped_server_is_unavailable_and_the_provider_recovers_after_restart(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    since = datetime.now(UTC) - timedelta(minutes=1)
    dovecot.append(_raw("before the outage"))
    assert len(provider.search(SearchQuery(since=since))) == 1

    dovecot.stop()
    with pytest.raises(ProviderUnavailable) as raised:
        provider.search(SearchQuery(since=since))
    assert raised.value.error_code == "connection_refused"

    dovecot.start()
    assert [_subject(m.raw) for m in provider.search(SearchQuery(since=since))] == [
        "before the outage"
    ]


def test_refused_connection_is_unavailable() -> None:
    imap = ImapProvider(
        name="nowhere", host="127.0.0.1", port=free_port(), tls=False, username="u", password="p"
    )

    with pytest.raises(ProviderUnavailable) as raised:
        imap.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "connection_refused"


def test_silent_server_times_out_as_unavailable() -> None:
    with _fake_server(lambda conn, stop: stop.wait(10)) as port:
        imap = ImapProvider(
            name="silent", host="127.0.0.1", port=port, tls=False, username="u", password="p",
            timeout=0.3,
        )  # fmt: skip

        with pytest.raises(ProviderUnavailable) as raised:
            imap.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "timeout"


def test_garbage_greeting_is_a_bad_response() -> None:
    def speak_http(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    with _fake_server(speak_http) as port:
        imap = ImapProvider(
            name="not-imap", host="127.0.0.1", port=port, tls=False, username="u", password="p"
        )

        with pytest.raises(ProviderUnavailable) as raised:
            imap.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "bad_response"


def _mail(subject: str, to: str, cc: str | None = None) -> bytes:
    cc_line = f"Cc: {cc}\r\n" if cc else ""
    return (
        f"From: app@example.test\r\nTo: {to}\r\n{cc_line}Subject: {subject}\r\n\r\nBody.\r\n"
    ).encode()


_FETCH_LINE = re.compile(rb"UID FETCH ([\d,:]+) \((.*)\)$")


def _fetched(proxy: RecordingProxy) -> tuple[set[int], set[int]]:
    """The UIDs whose INTERNALDATE, and whose body, the client FETCHed."""
    dates: set[int] = set()
    bodies: set[int] = set()
    for line in proxy.lines:
        match = _FETCH_LINE.search(line)
        if match is None:
            continue
        uids = {int(u) for u in match.group(1).split(b",")}
        (bodies if b"BODY" in match.group(2) else dates).update(uids)
    return dates, bodies


def test_a_look_fetches_only_the_messages_to_its_recipients(dovecot: DovecotServer) -> None:
    """SEARCH by To or Cc: other recipients' messages are never FETCHed; a
    recipient's mail of the same day but before the look is FETCHed for its
    INTERNALDATE only (SEARCH is day-granular), never for its body."""
    now = datetime.now(UTC).replace(microsecond=0)
    window = now - timedelta(minutes=1)
    alice = f"alice-{uuid.uuid4().hex[:6]}@example.test"
    bob = f"bob-{uuid.uuid4().hex[:6]}@example.test"
    to_alice = dovecot.append(_mail("to alice", f'"Alice" <{alice.upper()}>'), now)
    cc_bob = dovecot.append(_mail("cc bob", "list@example.test", cc=bob), window)
    near_miss = dovecot.append(_mail("bob early", bob), window - timedelta(minutes=5))
    earlier = dovecot.append(_mail("alice earlier", alice), window - timedelta(hours=2))
    old = dovecot.append(_mail("alice old", alice), window - timedelta(days=3))
    others = [
        dovecot.append(_mail(f"other {i}", f"other{i}@example.test", cc="list@example.test"), now)
        for i in range(8)
    ]
    query = SearchQuery(
        since=window - timedelta(minutes=10),
        recipients=frozenset({alice, bob}),
        windows={alice: window, bob: window},
    )

    with RecordingProxy(dovecot.host, dovecot.port) as proxy:
        imap = ImapProvider(
            name="counted", host=proxy.host, port=proxy.port, tls=False,
            username=dovecot.username, password=dovecot.password,
        )  # fmt: skip
        try:
            found = imap.search(query)
        finally:
            imap.close()

    assert [_subject(m.raw) for m in found] == ["bob early", "cc bob", "to alice"]
    dates, bodies = _fetched(proxy)
    assert bodies == {to_alice, cc_bob, near_miss}
    assert dates <= {to_alice, cc_bob, near_miss, earlier, old}
    assert {to_alice, cc_bob, near_miss} <= dates
    assert old not in dates  # days before the window: not even a SEARCH hit
    assert not dates & set(others)


def test_a_look_for_a_recipient_that_cannot_be_quoted_reads_the_whole_window(
    dovecot: DovecotServer, provider: ImapProvider
) -> None:
    since = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    dovecot.append(_mail("to someone", "someone@example.test"))
    recipient = "josé@example.test"

    found = provider.search(
        SearchQuery(since=since, recipients=frozenset({recipient}), windows={recipient: since})
    )

    assert [_subject(m.raw) for m in found] == ["to someone"]


def _subject(raw: bytes) -> str:
    for line in raw.decode().splitlines():
        if line.startswith("Subject: "):
            return line.removeprefix("Subject: ")
    raise AssertionError("no subject")


class _fake_server:
    """A one-shot loopback TCP server that hands its first client to `handler`.

    The handler gets the connection and an event set when the test is done.
    """

    def __init__(self, handler: Callable[[socket.socket, threading.Event], object]) -> None:
        self._handler = handler
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(5)

    def _run(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        with conn:
            self._handler(conn, self._stop)
