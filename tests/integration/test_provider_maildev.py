"""MaildevProvider against a real MailDev, and against scripted HTTP answers.

The real MailDev (tests/servers.py, installed by scripts/install-test-deps.sh)
proves the REST API is read as MailDev really serves it; the scripted server
gives the failures MailDev will not produce on demand (5xx, 429, garbage).
"""

from __future__ import annotations

import smtplib
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from app.errors import ProviderRejected, ProviderUnavailable
from app.providers.base import ProviderMessage, SearchQuery
from app.providers.maildev import MaildevProvider
from tests.servers import (
    MaildevServer,
    RecordingProxy,
    ScriptedHttpServer,
    ScriptedResponse,
    free_port,
    maildev_server,
)

pytestmark = [pytest.mark.integration, pytest.mark.providers]


@pytest.fixture
def provider(maildev: MaildevServer) -> Iterator[MaildevProvider]:
    catcher = MaildevProvider(name="catcher", url=maildev.url, timeout=5.0)
    yield catcher
    catcher.close()


@pytest.fixture
def scripted() -> Iterator[ScriptedHttpServer]:
    with ScriptedHttpServer() as server:
        yield server


@pytest.fixture
def scripted_catcher(scripted: ScriptedHttpServer) -> Iterator[MaildevProvider]:
    catcher = MaildevProvider(name="scripted", url=scripted.url)
    yield catcher
    catcher.close()


def _send(
    server: MaildevServer,
    subject: str,
    to: str = "Alice@Example.test",
    envelope_to: Sequence[str] | None = None,
    date: datetime | None = None,
) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "app@example.test"
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = format_datetime(date or datetime.now(UTC))
    message.set_content(f"Hello, this is {subject}.")
    with smtplib.SMTP(server.host, server.smtp_port, timeout=10) as smtp:
        smtp.send_message(message, to_addrs=list(envelope_to) if envelope_to else None)
    return message


def _search_until(
    provider: MaildevProvider, since: datetime, count: int, timeout: float = 10.0
) -> Sequence[ProviderMessage]:
    # MailDev stores a message shortly after the SMTP transaction ends.
    deadline = time.monotonic() + timeout
    while True:
        found = provider.search(SearchQuery(since=since))
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_sent_message_is_returned_with_raw_source_envelope_and_stable_id(
    maildev: MaildevServer, provider: MaildevProvider
) -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    _send(
        maildev,
        "your code is 493021",
        envelope_to=["Alice@Example.test", "audit+run-7@example.test"],
    )

    first = _search_until(provider, since, 1)
    second = provider.search(SearchQuery(since=since))

    assert len(first) == 1
    message = first[0]
    assert [m.provider_message_id for m in second] == [message.provider_message_id]
    assert b"Subject: your code is 493021" in message.raw
    assert b"Hello, this is your code is 493021." in message.raw
    assert message.envelope_recipients == ("alice@example.test", "audit+run-7@example.test")
    assert message.received_at.utcoffset() == timedelta(0)
    assert since <= message.received_at <= datetime.now(UTC) + timedelta(seconds=1)


def test_message_dated_before_since_is_not_returned(
    maildev: MaildevServer, provider: MaildevProvider
) -> None:
    since = datetime.now(UTC).replace(microsecond=0)
    # MailDev's `time` is the Date header: an old Date places it before the window.
    _send(maildev, "stale", date=since - timedelta(minutes=10))
    _send(maildev, "fresh", date=since + timedelta(seconds=1))

    found = _search_until(provider, since - timedelta(hours=1), 2)
    assert len(found) == 2, "both messages should be stored before the real check"

    subjects = [m.raw.split(b"Subject: ", 1)[1].split(b"\n", 1)[0].strip() for m in found]
    assert subjects == [b"stale", b"fresh"]
    in_window = provider.search(SearchQuery(since=since))
    assert [m.provider_message_id for m in in_window] == [found[1].provider_message_id]


def test_stopped_maildev_is_unavailable_and_a_restarted_one_works_again(
    maildev: MaildevServer, provider: MaildevProvider
) -> None:
    since = datetime.now(UTC) - timedelta(seconds=5)
    _send(maildev, "before the outage")
    before = _search_until(provider, since, 1)
    assert len(before) == 1

    maildev.stop()
    with pytest.raises(ProviderUnavailable) as raised:
        provider.search(SearchQuery(since=since))
    assert raised.value.error_code == "connection_refused"

    maildev.start()
    # The restarted MailDev reloads its mail directory asynchronously.
    after = _search_until(provider, since, 1)
    assert [m.provider_message_id for m in after] == [before[0].provider_message_id]
    _send(maildev, "after the outage")
    assert len(_search_until(provider, since, 2)) == 2


def test_maildev_with_web_auth_accepts_the_right_password_and_rejects_a_wrong_one(
    tmp_path: Path,
) -> None:
    with maildev_server(tmp_path, web_user="qa", web_pass="right-pass") as server:
        since = datetime.now(UTC) - timedelta(seconds=5)
        _send(server, "behind basic auth")
        good = MaildevProvider(name="a", url=server.url, username="qa", password="right-pass")
        bad = MaildevProvider(name="b", url=server.url, username="qa", password="wrong-pass")
        try:
            assert len(_search_until(good, since, 1)) == 1
            with pytest.raises(ProviderRejected) as raised:
                bad.search(SearchQuery(since=since))
            assert raised.value.error_code == "auth_failed"
        finally:
            good.close()
            bad.close()


def test_refused_connection_is_unavailable() -> None:
    catcher = MaildevProvider(name="nowhere", url=f"http://127.0.0.1:{free_port()}")

    with pytest.raises(ProviderUnavailable) as raised:
        catcher.search(SearchQuery(since=datetime.now(UTC)))
    catcher.close()

    assert raised.value.error_code == "connection_refused"


def _listing(*entries: tuple[str, datetime]) -> list[dict[str, object]]:
    return [
        {
            "id": message_id,
            "time": when.isoformat().replace("+00:00", "Z"),
            "subject": "s",
            "envelope": {"from": {"address": "a@x.test"}, "to": [{"address": "B@X.test"}]},
        }
        for message_id, when in entries
    ]


def test_only_messages_in_the_window_have_their_source_downloaded(
    scripted: ScriptedHttpServer,
    scripted_catcher: MaildevProvider,
) -> None:
    since = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    scripted.json("/email", _listing(("old1", since - timedelta(seconds=1)), ("new1", since)))
    scripted.routes["/email/old1/source"] = ScriptedResponse(200, b"Subject: old\r\n\r\nx")
    scripted.routes["/email/new1/source"] = ScriptedResponse(200, b"Subject: new\r\n\r\ny")
    found = scripted_catcher.search(SearchQuery(since=since))

    assert [(m.provider_message_id, m.raw) for m in found] == [("new1", b"Subject: new\r\n\r\ny")]
    assert found[0].envelope_recipients == ("b@x.test",)
    assert "/email/old1/source" not in scripted.requests


def test_message_deleted_between_list_and_source_is_skipped(
    scripted: ScriptedHttpServer,
    scripted_catcher: MaildevProvider,
) -> None:
    now = datetime.now(UTC)
    scripted.json("/email", _listing(("gone", now), ("here", now)))
    scripted.routes["/email/here/source"] = ScriptedResponse(200, b"Subject: here\r\n\r\n")

    found = scripted_catcher.search(SearchQuery(since=now - timedelta(minutes=1)))

    assert [m.provider_message_id for m in found] == ["here"]


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_error_is_unavailable_http_5xx(
    scripted: ScriptedHttpServer, scripted_catcher: MaildevProvider, status: int
) -> None:
    scripted.routes["/email"] = ScriptedResponse(status, b"oops")

    with pytest.raises(ProviderUnavailable) as raised:
        scripted_catcher.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "http_5xx"


def test_rate_limit_is_unavailable_with_the_retry_after_seconds(
    scripted: ScriptedHttpServer,
    scripted_catcher: MaildevProvider,
) -> None:
    scripted.routes["/email"] = ScriptedResponse(429, b"slow down", {"Retry-After": "42"})

    with pytest.raises(ProviderUnavailable) as raised:
        scripted_catcher.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "rate_limited"
    assert raised.value.retry_after == 42.0


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_rejected_as_auth_failed(
    scripted: ScriptedHttpServer, scripted_catcher: MaildevProvider, status: int
) -> None:
    scripted.routes["/email"] = ScriptedResponse(status, b"Unauthorized")

    with pytest.raises(ProviderRejected) as raised:
        scripted_catcher.search(SearchQuery(since=datetime.now(UTC)))

    assert raised.value.error_code == "auth_failed"
    assert raised.value.transient is False


@pytest.mark.parametrize(
    "body",
    [
        b"<html>not json</html>",
        b'{"emails": []}',
        b'[{"time": "2026-11-29T12:00:00.000Z"}]',
        b'[{"id": "x1", "time": "yesterday"}]',
        b'["x1"]',
    ],
    ids=["not-json", "object-not-list", "entry-without-id", "unparsable-time", "entry-not-object"],
)
def test_garbage_listing_is_a_bad_response(
    scripted: ScriptedHttpServer, scripted_catcher: MaildevProvider, body: bytes
) -> None:
    scripted.routes["/email"] = ScriptedResponse(200, body, {"Content-Type": "application/json"})

    with pytest.raises(ProviderUnavailable) as raised:
        scripted_catcher.search(SearchQuery(since=datetime.now(UTC) - timedelta(days=1)))

    assert raised.value.error_code == "bad_response"


def test_a_message_source_is_read_once_across_searches(
    scripted: ScriptedHttpServer, scripted_catcher: MaildevProvider
) -> None:
    when = datetime.now(UTC).replace(microsecond=0)
    scripted.json("/email", _listing(("m1", when)))
    scripted.routes["/email/m1/source"] = ScriptedResponse(
        200, b"To: a@example.test\r\nSubject: hi\r\n\r\nbody\r\n"
    )
    since = when - timedelta(seconds=5)
    first = scripted_catcher.search(SearchQuery(since=since))
    second = scripted_catcher.search(SearchQuery(since=since))
    assert [m.raw for m in first] == [m.raw for m in second]
    assert scripted.requests.count("/email/m1/source") == 1
    assert scripted.requests.count("/email") == 2


# -- a look downloads only what its recipients can match -------------------------------


def _send_raw(server: MaildevServer, raw: str, envelope_to: Sequence[str]) -> None:
    with smtplib.SMTP(server.host, server.smtp_port, timeout=10) as smtp:
        smtp.sendmail("app@example.test", list(envelope_to), raw.encode())


def _listed_ids(server: MaildevServer, count: int) -> dict[str, str]:
    """Subject → MailDev id of the `count` messages it lists (read directly,
    not through a proxy under test)."""
    deadline = time.monotonic() + 10
    while True:
        listed = httpx.get(f"{server.url}/email", timeout=10).json()
        if len(listed) >= count or time.monotonic() > deadline:
            return {m["subject"]: m["id"] for m in listed}
        time.sleep(0.05)


def _dated(subject: str, to: str, when: datetime, cc: str | None = None) -> str:
    headers = f"From: app@example.test\r\nTo: {to}\r\n"
    if cc is not None:
        headers += f"Cc: {cc}\r\n"
    return f"{headers}Subject: {subject}\r\nDate: {format_datetime(when)}\r\n\r\nbody\r\n"


def test_a_look_downloads_only_the_sources_its_recipients_can_match_over_one_connection(
    maildev: MaildevServer,
) -> None:
    """Two recipients with their own windows, nine other recipients' mail in
    them: only mail that may be addressed to a recipient inside its span is
    downloaded (named in To, only in Cc, only in the envelope, a near miss
    just before its window), all over one (slow to open) connection."""
    now = datetime.now(UTC).replace(microsecond=0)
    alice, bob = (
        f"alice-{uuid.uuid4().hex[:6]}@example.test",
        f"bob-{uuid.uuid4().hex[:6]}@example.test",
    )
    a_window, b_window = now - timedelta(minutes=1), now
    mails = {
        "to alice": (
            _dated("to alice", f'"Alice" <{alice.upper()}>', now - timedelta(seconds=30)),
            [alice],
        ),
        "cc alice": (
            _dated("cc alice", "list@example.test", a_window, cc=alice),
            ["list@example.test", alice],
        ),
        "bcc bob": (_dated("bcc bob", "list@example.test", now), [bob]),
        # Before bob's window, inside the look's lookback: a near miss worth reporting.
        "bob early": (_dated("bob early", bob, b_window - timedelta(minutes=5)), [bob]),
        # Inside the look (alice's lookback) but before bob's own: never bob's.
        "bob too early": (
            _dated("bob too early", bob, b_window - timedelta(minutes=10, seconds=30)),
            [bob],
        ),
        "alice too early": (
            _dated("alice too early", alice, a_window - timedelta(minutes=11)),
            [alice],
        ),
    }
    for i in range(9):
        other = f"other{i}-{uuid.uuid4().hex[:6]}@example.test"
        mails[f"other {i}"] = (_dated(f"other {i}", other, now - timedelta(seconds=20)), [other])
    for raw, envelope_to in mails.values():
        _send_raw(maildev, raw, envelope_to)
    ids = _listed_ids(maildev, len(mails))
    assert len(ids) == len(mails)

    with RecordingProxy(maildev.host, maildev.web_port, connect_delay=3) as proxy:
        catcher = MaildevProvider(name="slow-start", url=proxy.url, timeout=5.0)
        try:
            query = SearchQuery(
                since=a_window - timedelta(minutes=10, microseconds=1),
                recipients=frozenset({alice, bob}),
                windows={alice: a_window, bob: b_window},
            )
            found = catcher.search(query)
        finally:
            catcher.close()

    wanted = {"to alice", "cc alice", "bcc bob", "bob early"}
    assert {m.provider_message_id for m in found} == {ids[s] for s in wanted}
    sources = [p for p in proxy.requests if p.endswith("/source")]
    assert sorted(sources) == sorted(f"/email/{ids[s]}/source" for s in wanted)
    assert proxy.requests[0] == "/email"
    assert proxy.connections == 1  # the listing and every source over one connection


def test_a_listing_entry_that_does_not_say_whom_it_is_for_is_downloaded(
    scripted: ScriptedHttpServer, scripted_catcher: MaildevProvider
) -> None:
    """No headers in the entry: the message may be anyone's, so its source is read."""
    when = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    scripted.json(
        "/email",
        [
            {"id": "bare", "time": "2026-12-01T12:00:00.000Z"},
            {
                "id": "listed",
                "time": "2026-12-01T12:00:00.000Z",
                "headers": {"to": ["x@example.test", "Y <qa@example.test>"]},
            },
            {"id": "odd", "time": "2026-12-01T12:00:00.000Z", "headers": {"to": {"a": 1}}},
            {
                "id": "other",
                "time": "2026-12-01T12:00:00.000Z",
                "headers": {"To": "someone@example.test"},
                "to": [{"address": "someone@example.test"}],
                "envelope": {"to": [{"address": "someone@example.test"}]},
            },
        ],
    )
    for mid in ("bare", "listed", "odd", "other"):
        scripted.routes[f"/email/{mid}/source"] = ScriptedResponse(200, b"Subject: s\r\n\r\nx")
    query = SearchQuery(
        since=when - timedelta(minutes=10),
        recipients=frozenset({"qa@example.test"}),
        windows={"qa@example.test": when},
    )

    found = scripted_catcher.search(query)

    assert {m.provider_message_id for m in found} == {"bare", "listed", "odd"}
    assert "/email/other/source" not in scripted.requests


def test_an_address_that_cannot_be_looked_for_as_text_downloads_its_whole_window(
    scripted: ScriptedHttpServer, scripted_catcher: MaildevProvider
) -> None:
    when = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    scripted.json("/email", _listing(("m1", when), ("m2", when)))
    for mid in ("m1", "m2"):
        scripted.routes[f"/email/{mid}/source"] = ScriptedResponse(200, b"Subject: s\r\n\r\nx")
    recipient = "josé@example.test"
    query = SearchQuery(since=when, recipients=frozenset({recipient}), windows={recipient: when})

    assert [m.provider_message_id for m in scripted_catcher.search(query)] == ["m1", "m2"]
