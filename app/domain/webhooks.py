"""Pure decisions of the dead-letter webhook: its body, its signature, when
to try again and when to give up."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from app.domain.masking import mask_addresses

SIGNATURE_HEADER = "X-Signalbox-Signature"
# The fields a receiver gets: never a subject, a code or a link.
PAYLOAD_FIELDS = (
    "dead_letter_id",
    "namespace",
    "signal_id",
    "run_id",
    "test_case",
    "reason",
    "provider",
    "recommendation",
)


def payload_body(dead_letter: Mapping[Any, Any], test_case: str) -> str:
    """The JSON body POSTed for one dead letter, fixed once: every attempt
    sends the same bytes."""
    values = {
        "dead_letter_id": dead_letter["id"],
        "namespace": dead_letter["namespace"],
        "signal_id": dead_letter["signal_id"],
        "run_id": dead_letter["run_id"],
        "test_case": test_case,
        "reason": dead_letter["reason"],
        "provider": dead_letter["provider"],
        # The webhook goes to operators: addresses masked, as the API masks them for operators.
        "recommendation": (
            None
            if dead_letter["recommendation"] is None
            else mask_addresses(dead_letter["recommendation"])
        ),
    }
    return json.dumps({k: values[k] for k in PAYLOAD_FIELDS}, separators=(",", ":"))


# A receiver refuses a signature older than this (docs/api.md): a captured
# request cannot be replayed later.
SIGNATURE_TOLERANCE_SECONDS = 300


def signature(body: str, secret: str, timestamp: int) -> str:
    """The `X-Signalbox-Signature` value `t=<timestamp>,v1=<hex>`: HMAC-SHA256,
    keyed with the shared secret, of `"<timestamp>.<body>"`. Signing the time
    with the body lets a receiver refuse an old request replayed."""
    digest = hmac.new(secret.encode(), f"{timestamp}.{body}".encode(), hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify(
    header: str,
    body: str,
    secret: str,
    now: float,
    tolerance: float = SIGNATURE_TOLERANCE_SECONDS,
) -> bool:
    """What a receiver checks: a well-formed header, a `t` no older than
    `tolerance` (nor as far ahead), and a v1 equal in constant time to the
    HMAC recomputed over `"<t>.<body>"`."""
    fields = dict(part.partition("=")[::2] for part in header.split(","))
    stamp, given = fields.get("t", ""), fields.get("v1", "")
    if not (stamp.isascii() and stamp.isdigit()) or not given or abs(now - int(stamp)) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{stamp}.{body}".encode(), hashlib.sha256)
    return hmac.compare_digest(expected.hexdigest().encode(), given.encode())


def unsigned_warning(url: str, secret: str) -> str | None:
    """The warning due when deliveries would go out unsigned (a URL without a
    secret): a receiver could not tell them from forged ones."""
    if url and not secret:
        return (
            "SIGNALBOX_DEAD_LETTER_WEBHOOK_URL is set but SIGNALBOX_DEAD_LETTER_WEBHOOK_SECRET"
            " is empty: dead-letter webhooks are sent unsigned"
        )
    return None


def retry_delay(
    attempts: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Seconds before the next attempt after `attempts` failed ones:
    exponential (base·2^(n-1)), capped, with jitter in [½, 1] of it so
    deliveries failed together do not retry together."""
    step = min(cap, base * 2.0 ** max(0, min(attempts - 1, 40)))
    return step * (0.5 + 0.5 * (rng or random).random())


# Even past the horizon (workers were down all along), a delivery is tried this often.
MIN_ATTEMPTS = 3


def gives_up(
    created_at: datetime, next_attempt_at: datetime, attempts: int, *, retry_hours: float
) -> bool:
    """True once the next attempt would fall past the retry horizon and the
    delivery was tried at least MIN_ATTEMPTS times."""
    return attempts >= MIN_ATTEMPTS and next_attempt_at > created_at + timedelta(hours=retry_hours)


def is_success(status: int) -> bool:
    return 200 <= status < 300
