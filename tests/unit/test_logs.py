"""The JSON log formatter: one object a line, content kept out."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

import pytest

from app.infra import keys
from app.observability.logs import JsonFormatter, scrub
from app.settings import get_settings

KEY = b"a-deployment-key-0123456789abcdef"


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("test", logging.INFO, __file__, 1, msg, args or None, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def _format(record: logging.LogRecord, key: bytes | None = KEY) -> dict[str, object]:
    line = JsonFormatter("api", hash_key=key).format(record)
    assert "\n" not in line
    return json.loads(line)


def test_allowed_extras_are_kept_and_others_dropped() -> None:
    entry = _format(
        _record(
            "signal found",
            event="signal_found",
            signal_id="sig_1",
            run_id="run-1",
            recipient_hash="abc123abc123",
            body="Your code is 493817",
            recipient="alice@example.test",
        )
    )
    assert entry["event"] == "signal_found"
    assert entry["signal_id"] == "sig_1"
    assert entry["recipient_hash"] == "abc123abc123"
    assert entry["component"] == "api"
    assert "body" not in entry and "recipient" not in entry
    assert "493817" not in json.dumps(entry)


def test_addresses_in_library_messages_become_their_keyed_hash() -> None:
    entry = _format(_record("sender: %s", "Alice+Tag@Example.test"))
    digest = hmac.new(KEY, b"alice+tag@example.test", hashlib.sha256).hexdigest()[:12]
    assert entry["msg"] == f"sender: <addr:{digest}>"
    # Not the plain hash anyone can compute from a guessed address.
    assert hashlib.sha256(b"alice+tag@example.test").hexdigest()[:12] not in entry["msg"]


def test_the_formatter_hashes_with_the_process_key_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIGNALBOX_RECIPIENT_HASH_KEY", KEY.decode())
    get_settings.cache_clear()
    try:
        entry = _format(_record("rcpt %s", "bob@example.test"), key=None)
    finally:
        get_settings.cache_clear()
    digest = hmac.new(KEY, b"bob@example.test", hashlib.sha256).hexdigest()[:12]
    assert entry["msg"] == f"rcpt <addr:{digest}>"


def test_an_address_is_hidden_even_when_the_process_has_no_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_key(settings: object = None) -> bytes:
        raise OSError("read-only data directory")

    monkeypatch.setattr(keys, "recipient_hash_key", no_key)
    entry = _format(_record("rcpt %s", "bob@example.test"), key=None)
    assert entry["msg"] == "rcpt <addr>"


def test_links_and_bearer_tokens_are_scrubbed() -> None:
    text = "GET https://app.example.test/verify?token=s3cr3t Authorization: Bearer tok-abc.def"
    scrubbed = scrub(text)
    assert "s3cr3t" not in scrubbed and "tok-abc.def" not in scrubbed
    assert "<url>" in scrubbed and "Bearer <token>" in scrubbed


def test_broker_urls_and_celery_node_names_stay_readable() -> None:
    text = "Connected to redis://:**@127.0.0.1:6390/0 as worker-1@host ready."
    assert scrub(text) == text


def test_exception_text_is_reduced_to_its_type() -> None:
    try:
        raise ValueError("alice@example.test said 493817")
    except ValueError:
        import sys

        record = _record("failed")
        record.exc_info = sys.exc_info()
    line = JsonFormatter("worker").format(record)
    assert json.loads(line)["exc_type"] == "ValueError"
    assert "493817" not in line and "alice" not in line


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_logs_are_readable_lines_at_a_terminal_and_json_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.observability.logs import TextFormatter, formatter_for

    monkeypatch.delenv("SIGNALBOX_LOG_FORMAT", raising=False)
    assert type(formatter_for("api", _Stream(tty=True))) is TextFormatter
    assert type(formatter_for("api", _Stream(tty=False))) is JsonFormatter
    assert type(formatter_for("api", _Stream(tty=True), "json")) is JsonFormatter
    assert type(formatter_for("api", _Stream(tty=False), "text")) is TextFormatter
    monkeypatch.setenv("SIGNALBOX_LOG_FORMAT", "json")
    assert type(formatter_for("api", _Stream(tty=True))) is JsonFormatter


def test_a_readable_line_keeps_the_allow_list_and_the_scrubbing() -> None:
    from app.observability.logs import TextFormatter

    record = _record(
        "mail for alice@example.test\nsecond line",
        event="signal_found",
        signal_id="sig_1",
        body="Your code is 493817",
    )
    line = TextFormatter("worker", hash_key=KEY).format(record)
    assert "\n" not in line and not line.startswith("{")
    assert "INFO" in line and "worker" in line and "event=signal_found" in line
    assert "signal_id=sig_1" in line and "second line" in line
    assert "alice@example.test" not in line and "<addr:" in line
    assert "493817" not in line


def test_a_servers_listening_address_is_kept_and_every_other_url_redacted() -> None:
    from app.observability.logs import scrub

    assert scrub("Uvicorn running on http://127.0.0.1:8040 (Press CTRL+C to quit)") == (
        "Uvicorn running on http://127.0.0.1:8040 (Press CTRL+C to quit)"
    )
    assert scrub("listening on http://localhost:8040/ and http://[::1]:80") == (
        "listening on http://localhost:8040/ and http://[::1]:80"
    )
    for secret in (
        "http://127.0.0.1:8040/verify?token=abc",
        "https://app.example.test",
        "http://user:pw@127.0.0.1:80",
        "http://127.0.0.1:8040?t=1",
        "http://127.0.0.1:8040#frag",
    ):
        assert scrub(f"x {secret} y") == "x <url> y", secret
