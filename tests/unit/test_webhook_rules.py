"""Pure rules of the dead-letter webhook: body, signature, backoff, giving up."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.domain import webhooks as rules
from app.settings import Settings
from app.usecases import webhooks

DEAD_LETTER = {
    "id": "dlq_1",
    "namespace": "team-a",
    "signal_id": "sig_1",
    "run_id": "ci-1",
    "reason": "deadline",
    "provider": "sink",
    "recommendation": "Raise expires_in_seconds.",
    "near_misses": [{"subject": "Your code 493817"}],
    "recipient": "secret@example.test",
}


def test_body_has_exactly_the_contract_fields_and_nothing_else() -> None:
    body = json.loads(rules.payload_body(DEAD_LETTER, "test_signup"))
    assert list(body) == list(rules.PAYLOAD_FIELDS)
    assert body["test_case"] == "test_signup" and body["dead_letter_id"] == "dlq_1"
    assert "493817" not in json.dumps(body) and "secret@" not in json.dumps(body)


def test_the_recommendation_goes_out_with_addresses_masked_as_for_operators() -> None:
    typo = {
        **DEAD_LETTER,
        "recommendation": "A message went to secret@example.tset instead of secret@example.test.",
    }
    body = json.loads(rules.payload_body(typo, "t"))
    assert body["recommendation"] == "A message went to <address> instead of <address>"
    assert (
        json.loads(rules.payload_body({**DEAD_LETTER, "recommendation": None}, "t"))[
            "recommendation"
        ]
        is None
    )


SECRET = "s3cret"
NOW = 1_780_000_000


def test_signature_is_hmac_sha256_of_the_time_and_the_exact_body() -> None:
    body = rules.payload_body(DEAD_LETTER, "t")
    expected = hmac.new(b"s3cret", f"{NOW}.{body}".encode(), hashlib.sha256).hexdigest()
    assert rules.signature(body, SECRET, NOW) == f"t={NOW},v1={expected}"
    assert rules.signature(body, "other", NOW) != rules.signature(body, SECRET, NOW)
    assert rules.signature(body, SECRET, NOW + 1) != rules.signature(body, SECRET, NOW)


def test_a_signature_verifies_over_its_time_and_body() -> None:
    body = rules.payload_body(DEAD_LETTER, "t")
    header = rules.signature(body, SECRET, NOW)
    assert rules.verify(header, body, SECRET, now=NOW + 299)
    assert not rules.verify(header, body, "other", now=NOW)
    assert not rules.verify(header, body + " ", SECRET, now=NOW)


def test_a_replayed_body_under_another_time_fails_verification() -> None:
    body = rules.payload_body(DEAD_LETTER, "t")
    v1 = rules.signature(body, SECRET, NOW).partition(",v1=")[2]
    # The attacker keeps the body and the v1 it saw and writes a fresh t.
    assert not rules.verify(f"t={NOW + 600},v1={v1}", body, SECRET, now=NOW + 600)


def test_a_signature_older_than_five_minutes_is_refused() -> None:
    body = rules.payload_body(DEAD_LETTER, "t")
    header = rules.signature(body, SECRET, NOW)
    assert rules.SIGNATURE_TOLERANCE_SECONDS == 300
    assert not rules.verify(header, body, SECRET, now=NOW + 301)
    assert not rules.verify(header, body, SECRET, now=NOW - 301)  # nor from the future


@pytest.mark.parametrize(
    "header",
    ["", "sha256=abc", "t=,v1=abc", "t=x,v1=abc", "t=1780000000", "v1=abc", "t=\u00b2,v1=a"],
)
def test_a_malformed_signature_header_fails_verification(header: str) -> None:
    assert not rules.verify(header, "{}", SECRET, now=NOW)


def test_an_unsigned_webhook_is_warned_about_only_with_a_url_and_no_secret() -> None:
    warning = rules.unsigned_warning("https://hooks.example.test/x?key=k", "")
    assert warning and "SIGNALBOX_DEAD_LETTER_WEBHOOK_SECRET" in warning
    assert "hooks.example.test" not in warning  # the URL may carry a secret
    assert rules.unsigned_warning("https://hooks.example.test/x", SECRET) is None
    assert rules.unsigned_warning("", "") is None


def test_retry_delay_grows_exponentially_within_jitter_and_is_capped() -> None:
    rng = random.Random(7)
    delays = [rules.retry_delay(n, base=5, cap=900, rng=rng) for n in range(1, 12)]
    for n, delay in enumerate(delays, start=1):
        step = min(900, 5 * 2 ** (n - 1))
        assert step / 2 <= delay <= step
    assert rules.retry_delay(10_000, base=5, cap=900) <= 900


def test_gives_up_only_past_the_retry_horizon_and_after_a_few_attempts() -> None:
    created = datetime(2026, 1, 1, tzinfo=UTC)
    late = created + timedelta(hours=24, seconds=1)
    assert not rules.gives_up(created, created + timedelta(hours=23), 9, retry_hours=24)
    assert rules.gives_up(created, late, 3, retry_hours=24)
    # Workers down all day: the first attempt is not the last.
    assert not rules.gives_up(created, late, 1, retry_hours=24)


def test_only_2xx_is_success() -> None:
    assert rules.is_success(200) and rules.is_success(204)
    assert not rules.is_success(301) and not rules.is_success(500) and not rules.is_success(199)


def test_console_masks_codes_links_and_addresses_in_subjects() -> None:
    from app.console.routes.common import mask_subject

    masked = mask_subject("Code 771234 for bob@example.test: https://x.test/t?k=abc")
    assert "771234" not in masked and "bob@" not in masked and "https://" not in masked
    assert masked.startswith("Code <code> for <address>")
    assert mask_subject("Verify your account") == "Verify your account"


def test_a_delivering_process_logs_one_warning_when_the_webhook_has_no_secret(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhooks, "_warned", False)
    url = "https://hooks.example.test/x?key=k"
    unsigned = Settings(dead_letter_webhook_url=url, dead_letter_webhook_secret="")
    with caplog.at_level("WARNING", logger="signalbox.webhooks"):
        assert webhooks.warn_if_unsigned(unsigned)
        assert webhooks.warn_if_unsigned(unsigned)  # once per process
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events == ["webhook_unsigned"]
    assert url not in caplog.text


def test_no_warning_when_the_webhook_is_signed_or_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhooks, "_warned", False)
    signed = Settings(
        dead_letter_webhook_url="https://h.example.test", dead_letter_webhook_secret=SECRET
    )
    with caplog.at_level("WARNING", logger="signalbox.webhooks"):
        assert not webhooks.warn_if_unsigned(signed)
        assert not webhooks.warn_if_unsigned(Settings(dead_letter_webhook_url=""))
    assert not caplog.records


def test_the_receivers_snippet_in_the_docs_verifies_and_refuses_a_replay() -> None:
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    start = docs.index("```python\n  import hashlib, hmac, time")
    block = docs[start : docs.index("```\n", start + 10)].splitlines()[1:]
    namespace: dict[str, Any] = {}
    exec("\n".join(line.removeprefix("  ") for line in block), namespace)
    verify = namespace["verify"]
    body = rules.payload_body(DEAD_LETTER, "t")
    now = int(time.time())
    header = rules.signature(body, SECRET, now)
    assert verify(header, body.encode(), SECRET)
    assert not verify(header, body.encode(), "other")
    v1 = header.partition(",v1=")[2]
    assert not verify(f"t={now + 1},v1={v1}", body.encode(), SECRET)  # replayed under a new t
    assert not verify(rules.signature(body, SECRET, now - 301), body.encode(), SECRET)
