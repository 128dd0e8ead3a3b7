"""Signal states, the allowed transitions, and the result a caller sees.

```
waiting ──found a match──▶ found ──claim──▶ claimed ──consume──▶ consumed
   │                         ▲                 │
   │                         └──lease lapsed───┤ (claims left)
   ▼                                           ▼
expired ◀──── deadline / check budget / provider errors / claims exhausted
   └── redrive ──▶ waiting
```
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    WAITING = "waiting"
    FOUND = "found"
    CLAIMED = "claimed"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class Result(StrEnum):
    WAITING = "waiting"
    PROVIDER_ERROR = "provider_error"
    FOUND = "found"
    CLAIMED = "claimed"
    CONSUMED = "consumed"
    EXPIRED = "expired"


class ExpiryReason(StrEnum):
    DEADLINE = "deadline"
    CHECK_BUDGET = "check_budget"
    PROVIDER_ERRORS = "provider_errors"
    CLAIMS_EXHAUSTED = "claims_exhausted"


class CheckReason(StrEnum):
    FIRST = "first"
    SCHEDULED = "scheduled"
    PUSH = "push"
    ERROR_RETRY = "error_retry"
    SWEEP = "sweep"
    REDRIVE = "redrive"


class CheckOutcome(StrEnum):
    NO_MATCH = "no_match"
    MATCHED = "matched"
    PROVIDER_ERROR = "provider_error"
    CIRCUIT_OPEN = "circuit_open"


class DeadLetterState(StrEnum):
    OPEN = "open"
    REDRIVEN = "redriven"
    DISCARDED = "discarded"


TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.WAITING, Status.FOUND),
        (Status.WAITING, Status.EXPIRED),
        (Status.FOUND, Status.CLAIMED),
        (Status.CLAIMED, Status.FOUND),
        (Status.CLAIMED, Status.CONSUMED),
        (Status.CLAIMED, Status.EXPIRED),
        (Status.EXPIRED, Status.WAITING),
    }
)

DEAD_LETTER_TRANSITIONS: frozenset[tuple[DeadLetterState, DeadLetterState]] = frozenset(
    {
        (DeadLetterState.OPEN, DeadLetterState.REDRIVEN),
        (DeadLetterState.OPEN, DeadLetterState.DISCARDED),
    }
)

FINAL = frozenset({Status.CONSUMED})


def can_transition(src: Status, dst: Status) -> bool:
    return (src, dst) in TRANSITIONS


def result_of(status: Status, last_outcome: str | None) -> Result:
    """The result a caller sees: a waiting signal whose latest check failed is
    `provider_error`, so nobody reads a provider outage as "no email yet"."""
    if status is Status.WAITING:
        if last_outcome in (CheckOutcome.PROVIDER_ERROR, CheckOutcome.CIRCUIT_OPEN):
            return Result.PROVIDER_ERROR
        return Result.WAITING
    return Result(status.value)
