"""When to look at the provider again (docs/api.md, "Signals": backoff).

First check at once (the caller's job), then exponential with jitter, capped,
never past the signal's deadline. Pure: the caller passes ``now`` and the random
number, so every schedule is reproducible in tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = [
    "MIN_DELAY_SECONDS",
    "PUSH_POLL_HINT_SECONDS",
    "BackoffPolicy",
    "next_check_at",
    "poll_hint_seconds",
    "retry_after_seconds",
]

# Below this a "backoff" is a busy loop against the provider.
MIN_DELAY_SECONDS = 0.2

# The longest a caller is told to wait before looking again at a signal on a
# provider that pushes its arrivals (the sink): such a signal's next scheduled
# check is its deadline, yet its mail is matched the moment it arrives.
PUSH_POLL_HINT_SECONDS = 5


@dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff with proportional jitter.

    The n-th wait (after ``n`` checks) is ``base_seconds * factor ** (n - 1)``,
    capped at ``cap_seconds``, then moved by up to ``±jitter`` of itself, and
    finally clamped to ``[0.2 s, cap_seconds]``. Jitter spreads the checks of
    signals created together so they do not hit the provider in lockstep.

    Raises ``ValueError`` on construction for a policy that cannot back off
    (non-positive base or cap, factor below 1, jitter outside ``[0, 1)``).
    """

    base_seconds: float = 1.0
    factor: float = 2.0
    cap_seconds: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        for name, value in (
            ("base_seconds", self.base_seconds),
            ("factor", self.factor),
            ("cap_seconds", self.cap_seconds),
            ("jitter", self.jitter),
        ):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if self.base_seconds <= 0:
            raise ValueError(f"base_seconds must be > 0, got {self.base_seconds!r}")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")
        if self.cap_seconds <= 0:
            raise ValueError(f"cap_seconds must be > 0, got {self.cap_seconds!r}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter!r}")

    def base_delay(self, checks_done: int) -> float:
        """The un-jittered wait after ``checks_done`` checks, capped; non-decreasing.

        ``checks_done`` below 1 is read as 1 (the wait after the first check).
        """
        exponent = max(checks_done, 1) - 1
        try:
            raw = self.base_seconds * math.pow(self.factor, exponent)
        except OverflowError:
            return self.cap_seconds
        return min(raw, self.cap_seconds)

    def delay(self, checks_done: int, rand: float) -> float:
        """Seconds to wait before the next check, given ``rand`` drawn from ``[0, 1)``.

        ``rand = 0.5`` gives the un-jittered delay; 0 and 1 the extremes. The
        result is never above ``cap_seconds`` and never below 0.2 s (or the cap,
        if a policy sets the cap lower than that). ``rand`` outside ``[0, 1]``
        is clamped.
        """
        rand = min(max(rand, 0.0), 1.0) if math.isfinite(rand) else 0.5
        jittered = self.base_delay(checks_done) * (1 + self.jitter * (2 * rand - 1))
        floor = min(MIN_DELAY_SECONDS, self.cap_seconds)
        return min(max(jittered, floor), self.cap_seconds)


def next_check_at(now: datetime, delay_seconds: float, expires_at: datetime) -> datetime:
    """``now + delay_seconds``, but never later than ``expires_at``.

    A negative (or NaN) delay means "at once" (``now``). When ``now`` is already past the
    deadline the answer is ``expires_at``: the check that finds the signal
    expired is due immediately.
    """
    delay = 0.0 if math.isnan(delay_seconds) else max(delay_seconds, 0.0)
    # Compare before adding: a huge delay would overflow datetime arithmetic.
    if delay >= (expires_at - now).total_seconds():
        return expires_at
    return now + timedelta(seconds=delay)


def retry_after_seconds(now: datetime, next_check_at: datetime | None) -> int:
    """Whole seconds a caller should wait before asking again: the wait rounded up, at least 1.

    With no check scheduled (``None``), or one already due, the answer is 1.
    """
    if next_check_at is None:
        return 1
    wait = next_check_at - now
    # Integer arithmetic on timedeltas: float seconds would round 2.000001 s down.
    whole = -(-wait // timedelta(seconds=1))
    return max(int(whole), 1)


def poll_hint_seconds(now: datetime, next_check_at: datetime | None, *, pushes: bool) -> int:
    """The view's ``retry_after_seconds``: when a caller's next look is due.

    The wait for the next scheduled check (`retry_after_seconds`), at most
    ``PUSH_POLL_HINT_SECONDS`` for a provider that pushes its arrivals: there
    the next check is scheduled at the deadline, and telling a caller to sleep
    until then would have it sleep through the mail. Never the time left to
    the deadline as such.
    """
    wait = retry_after_seconds(now, next_check_at)
    return min(wait, PUSH_POLL_HINT_SECONDS) if pushes else wait
