"""What follows a check that found nothing: pure, no I/O.

Given the signal's counters, the check's outcome and the clock, decide
whether the check spends budget, the new consecutive-error count, whether the
signal expires (and why), and when and why it is checked next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.domain.backoff import BackoffPolicy, next_check_at
from app.domain.states import CheckOutcome, CheckReason, ExpiryReason


@dataclass(frozen=True)
class Counters:
    """The signal as the check found it."""

    checks_count: int
    max_checks: int
    consecutive_errors: int
    expires_at: datetime


@dataclass(frozen=True)
class NextStep:
    counts: bool  # spends one of max_checks
    consecutive_errors: int
    expiry: ExpiryReason | None
    next_check_at: datetime
    next_reason: CheckReason


def after_check(
    counters: Counters,
    outcome: CheckOutcome,
    *,
    now: datetime,
    retry_after: float | None,
    policy: BackoffPolicy,
    max_provider_errors: int,
    rand: float,
) -> NextStep:
    """Decide what follows a check whose outcome is not `matched`.

    A check skipped by an open breaker (`circuit_open`) and a rate-limited
    answer (a provider error that came with a Retry-After) only delay the
    next check: they spend neither the check budget nor the provider-error
    allowance. The deadline always runs. `retry_after` (seconds) is a floor
    for the next delay; the next check is never past the deadline.
    """
    if outcome is CheckOutcome.MATCHED:
        raise ValueError("a matched check has no next step")
    rate_limited = outcome is CheckOutcome.PROVIDER_ERROR and retry_after is not None
    counts = outcome is not CheckOutcome.CIRCUIT_OPEN and not rate_limited
    checks_done = counters.checks_count + (1 if counts else 0)
    if outcome is CheckOutcome.NO_MATCH:
        errors = 0
    elif outcome is CheckOutcome.PROVIDER_ERROR and not rate_limited:
        errors = counters.consecutive_errors + 1
    else:
        errors = counters.consecutive_errors

    expiry: ExpiryReason | None = None
    if outcome is CheckOutcome.PROVIDER_ERROR and errors >= max_provider_errors:
        expiry = ExpiryReason.PROVIDER_ERRORS
    elif counts and checks_done >= counters.max_checks:
        expiry = ExpiryReason.CHECK_BUDGET
    elif now >= counters.expires_at:
        expiry = ExpiryReason.DEADLINE

    if outcome is CheckOutcome.NO_MATCH:
        delay, reason = policy.delay(max(1, checks_done), rand), CheckReason.SCHEDULED
    else:
        delay, reason = policy.delay(max(1, errors), rand), CheckReason.ERROR_RETRY
    if retry_after is not None:
        delay = max(delay, retry_after)
    return NextStep(
        counts=counts,
        consecutive_errors=errors,
        expiry=expiry,
        next_check_at=next_check_at(now, delay, counters.expires_at),
        next_reason=reason,
    )
