"""Pure rules of the dead-letter webhook: body, signature, backoff, giving up."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from datetime import UTC, datetime, timedelta

from app.domain import webhooks as rules

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


def test_signature_is_hmac_sha256_of_the_exact_body() -> None:
    body = rules.payload_body(DEAD_LETTER, "t")
    expected = hmac.new(b"s3cret", body.encode(), hashlib.sha256).hexdigest()
    assert rules.signature(body, "s3cret") == f"sha256={expected}"
    assert rules.signature(body, "other") != rules.signature(body, "s3cret")


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
