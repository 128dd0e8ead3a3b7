"""The signal's next step after a look, under the deployment's settings.

Both the whole look (`decide`) and the one-statement first look (`first`)
ask the same question of the schedule; this is where the signal's row and the
settings become the schedule's inputs, so that the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.domain.backoff import BackoffPolicy
from app.domain.scheduling import Counters, NextStep, after_check
from app.domain.states import CheckOutcome, CheckReason
from app.settings import Settings


def next_step(
    settings: Settings,
    row: Mapping[str, Any],
    outcome: CheckOutcome,
    *,
    reason: CheckReason,
    looked_at: datetime,
    now: datetime,
    retry_after: float | None,
    rand: float,
    pushes: bool,
) -> NextStep:
    """What the signal `row` (as the check read it) does after a look that
    began at `looked_at` and ended in `outcome`."""
    return after_check(
        Counters(
            checks_count=row["checks_count"],
            max_checks=row["max_checks"],
            consecutive_errors=row["consecutive_errors"],
            expires_at=row["expires_at"],
        ),
        outcome,
        reason=reason,
        looked_at=looked_at,
        now=now,
        retry_after=retry_after,
        policy=BackoffPolicy(
            base_seconds=settings.backoff_base_seconds, cap_seconds=settings.backoff_cap_seconds
        ),
        max_provider_errors=settings.max_consecutive_provider_errors,
        rand=rand,
        pushes=pushes,
    )
