"""What follows a check that found nothing: pure, no I/O.

Given the signal's counters, why the check ran, the check's outcome and the
clock, decide whether the check spent budget, the new consecutive-error
count, whether the signal expires (and why), and when and why it is checked
next.

Two promises are decided here (docs/api.md, "Nothing before the deadline is
lost"):

- the deadline expires a signal only after a look at the provider that began
  at or after the deadline: until then the next check is scheduled no later
  than the deadline, so the last look always covers the whole window;
- only the checks the schedule asked for (`first`, `scheduled`,
  `error_retry`, `sweep`) spend `max_checks`; a push or a redrive never does,
  and the last check of the budget is kept for the deadline: a look before
  the deadline never spends it, so `max_checks: 1` is one provider call, made
  at the deadline (a polled provider's first check is scheduled there), and
  no budget ends a wait before its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from app.domain.backoff import BackoffPolicy, next_check_at
from app.domain.states import CheckOutcome, CheckReason, ExpiryReason

# Reasons whose checks spend the budget: the ones the schedule asked for.
COUNTED_REASONS = frozenset(
    {CheckReason.FIRST, CheckReason.SCHEDULED, CheckReason.ERROR_RETRY, CheckReason.SWEEP}
)


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


def spends_budget(reason: CheckReason, outcome: CheckOutcome, retry_after: float | None) -> bool:
    """Whether a check spends one of `max_checks`.

    Only checks the schedule asked for do, and not when the provider was not
    really asked (an open breaker) or asked us to wait (a Retry-After).
    """
    if reason not in COUNTED_REASONS:
        return False
    if outcome is CheckOutcome.CIRCUIT_OPEN:
        return False
    return not (outcome is CheckOutcome.PROVIDER_ERROR and retry_after is not None)


def keeps_for_deadline(counters: Counters, looked_at: datetime) -> bool:
    """Whether a look that began at `looked_at` would spend the last check
    of the budget before the deadline: it must not (docs/api.md, `max_checks`:
    with a budget of one, the one counted look is the deadline's)."""
    return looked_at < counters.expires_at and counters.max_checks - counters.checks_count <= 1


def first_check_delay(expires_in: float, max_checks: int, *, pushes: bool) -> float:
    """Seconds from a signal's creation to its first check. At once, except
    with a budget of one on a provider that must be asked (it does not
    push): its one call is the deadline's, so the first check is then."""
    if max_checks <= 1 and not pushes:
        return max(0.0, float(expires_in))
    return 0.0


def after_check(
    counters: Counters,
    outcome: CheckOutcome,
    *,
    reason: CheckReason = CheckReason.SCHEDULED,
    looked_at: datetime | None = None,
    now: datetime,
    retry_after: float | None,
    policy: BackoffPolicy,
    max_provider_errors: int,
    rand: float,
    pushes: bool = False,
) -> NextStep:
    """Decide what follows a check whose outcome is not `matched`.

    `looked_at` is when the check's look at the provider began (default:
    `now`); `now` is when its result is written. A check skipped by an open
    breaker (`circuit_open`) and a rate-limited answer (a provider error that
    came with a Retry-After) only delay the next check: they spend neither
    the check budget nor the provider-error allowance. `retry_after`
    (seconds) is a floor for the next delay; the next check is never past
    the deadline, and when one check of the budget is left it is kept for
    the deadline itself. A final look that failed is tried again after the
    deadline (the sweep bounds how long). A provider that `pushes` every arrival (the sink)
    needs no scheduled look between the first and the final one: after a
    look that found nothing, the next scheduled one is the deadline's.
    """
    if outcome is CheckOutcome.MATCHED:
        raise ValueError("a matched check has no next step")
    looked_at = looked_at if looked_at is not None else now
    rate_limited = outcome is CheckOutcome.PROVIDER_ERROR and retry_after is not None
    counts = spends_budget(reason, outcome, retry_after)
    if counts and keeps_for_deadline(counters, looked_at):
        # The last check of the budget is the deadline's: a look before it
        # (a first look, one that rode along with another signal's check)
        # is free, so no budget ends a wait before its deadline.
        counts = False
    checks_done = counters.checks_count + (1 if counts else 0)
    if outcome is CheckOutcome.NO_MATCH:
        errors = 0
    elif outcome is CheckOutcome.PROVIDER_ERROR and not rate_limited:
        errors = counters.consecutive_errors + 1
    else:
        errors = counters.consecutive_errors

    final = looked_at >= counters.expires_at
    expiry: ExpiryReason | None = None
    if outcome is CheckOutcome.PROVIDER_ERROR and errors >= max_provider_errors:
        expiry = ExpiryReason.PROVIDER_ERRORS
    elif final and outcome is CheckOutcome.NO_MATCH:
        # The final look saw the provider: it covered the whole window.
        expiry = ExpiryReason.DEADLINE
    elif checks_done >= counters.max_checks:
        expiry = ExpiryReason.CHECK_BUDGET

    if outcome is CheckOutcome.NO_MATCH:
        delay, next_reason = policy.delay(max(1, checks_done), rand), CheckReason.SCHEDULED
    else:
        delay, next_reason = policy.delay(max(1, errors), rand), CheckReason.ERROR_RETRY
    if retry_after is not None:
        delay = max(delay, retry_after)
    when = next_check_at(now, delay, counters.expires_at)
    if final and outcome is not CheckOutcome.NO_MATCH:
        # The final look failed (provider error, open breaker): it is tried
        # again on the backoff until it sees the provider; the sweep gives up
        # SIGNALBOX_DEADLINE_GRACE_SECONDS after the deadline.
        when = now + timedelta(seconds=max(delay, 0.0))
    elif counters.max_checks - checks_done == 1 or (pushes and outcome is CheckOutcome.NO_MATCH):
        # The last check the budget allows is the one at the deadline.
        when = max(when, counters.expires_at)
    return NextStep(
        counts=counts,
        consecutive_errors=errors,
        expiry=expiry,
        next_check_at=when,
        next_reason=next_reason,
    )
