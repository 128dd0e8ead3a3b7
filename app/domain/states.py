"""Signal states, the allowed transitions, and the result a caller sees.

```
waiting ──found a match──▶ found ──claim──▶ claimed ──consume──▶ consumed
   │                         ▲                 │
   │                         └──lease lapsed───┤ (claims left)
   ▼                                           ▼
expired ◀──── deadline / check budget / provider errors / claims exhausted / duplicates
   └── redrive ──▶ waiting

waiting ──a match (expect none)──▶ arrived        waiting ──final look, none (expect none)──▶ absent

waiting, found, claimed ──cancel (the test ended or failed)──▶ cancelled   (final, no dead letter)
```
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    WAITING = "waiting"
    FOUND = "found"
    CLAIMED = "claimed"
    CONSUMED = "consumed"
    EXPIRED = "expired"
    # Of a signal that expects no email (`expect: none`): both final.
    ABSENT = "absent"
    ARRIVED = "arrived"
    # Ended by its producer (a test that failed or ended): final, no dead letter.
    CANCELLED = "cancelled"


class Result(StrEnum):
    """What a caller sees: the signal's status, or `provider_error` for a
    waiting one whose latest check failed (`result_of`)."""

    WAITING = Status.WAITING.value
    PROVIDER_ERROR = "provider_error"
    FOUND = Status.FOUND.value
    CLAIMED = Status.CLAIMED.value
    CONSUMED = Status.CONSUMED.value
    EXPIRED = Status.EXPIRED.value
    ABSENT = Status.ABSENT.value
    ARRIVED = Status.ARRIVED.value
    CANCELLED = Status.CANCELLED.value


class ExpiryReason(StrEnum):
    DEADLINE = "deadline"
    CHECK_BUDGET = "check_budget"
    PROVIDER_ERRORS = "provider_errors"
    CLAIMS_EXHAUSTED = "claims_exhausted"
    # `expect: exactly_one`: a second matching message within the settle time.
    DUPLICATE_MESSAGES = "duplicate_messages"


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


class ClaimState(StrEnum):
    ACTIVE = "active"
    RELEASED = "released"
    LAPSED = "lapsed"
    CONSUMED = "consumed"
    # Its signal was cancelled while the lease was active.
    CANCELLED = "cancelled"


class DeliveryState(StrEnum):
    """Of a dead letter's webhook delivery."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


# Where each status may move to (the diagram above).
_MOVES: dict[Status, tuple[Status, ...]] = {
    Status.WAITING: (
        Status.FOUND,
        Status.EXPIRED,
        Status.ABSENT,
        Status.ARRIVED,
        Status.CANCELLED,
    ),
    Status.FOUND: (Status.CLAIMED, Status.CANCELLED),
    Status.CLAIMED: (Status.FOUND, Status.CONSUMED, Status.EXPIRED, Status.CANCELLED),
    Status.EXPIRED: (Status.WAITING,),
}

TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    (src, dst) for src, dsts in _MOVES.items() for dst in dsts
)

DEAD_LETTER_TRANSITIONS: frozenset[tuple[DeadLetterState, DeadLetterState]] = frozenset(
    {
        (DeadLetterState.OPEN, DeadLetterState.REDRIVEN),
        (DeadLetterState.OPEN, DeadLetterState.DISCARDED),
    }
)

FINAL = frozenset({Status.CONSUMED, Status.ABSENT, Status.ARRIVED, Status.CANCELLED})


def can_transition(src: Status, dst: Status) -> bool:
    return (src, dst) in TRANSITIONS


@dataclass(frozen=True)
class Transition:
    """One allowed move of a signal. The repository's guarded UPDATEs take
    their `WHERE status = :src` and `SET status = :dst` from one of these, so
    no code can move a signal along an arrow the table does not draw."""

    src: Status
    dst: Status

    @property
    def params(self) -> dict[str, str]:
        return {"src": self.src.value, "dst": self.dst.value}


def transition(src: Status, dst: Status) -> Transition:
    """The transition src → dst; ValueError if the state machine has no such arrow."""
    if not can_transition(src, dst):
        raise ValueError(f"no transition {src.value} → {dst.value} in the state machine")
    return Transition(src, dst)


FIND = transition(Status.WAITING, Status.FOUND)
CLAIM = transition(Status.FOUND, Status.CLAIMED)
GIVE_BACK = transition(Status.CLAIMED, Status.FOUND)
CONSUME = transition(Status.CLAIMED, Status.CONSUMED)
REDRIVE = transition(Status.EXPIRED, Status.WAITING)
# `expect: none`: no matching message by the final look, or one before the deadline.
ABSENCE = transition(Status.WAITING, Status.ABSENT)
ARRIVAL = transition(Status.WAITING, Status.ARRIVED)
# A producer ends a signal that has not ended (`POST /v1/signals/{id}/cancel`).
CANCELS = tuple(
    transition(src, Status.CANCELLED) for src in (Status.WAITING, Status.FOUND, Status.CLAIMED)
)


def dead_letter_transition(src: DeadLetterState, dst: DeadLetterState) -> tuple[str, str]:
    """(src, dst) of a dead letter's move; ValueError if not allowed."""
    if (src, dst) not in DEAD_LETTER_TRANSITIONS:
        raise ValueError(f"no dead-letter transition {src.value} → {dst.value}")
    return src.value, dst.value


def result_of(status: Status, last_outcome: str | None) -> Result:
    """The result a caller sees: a waiting signal whose latest check failed is
    `provider_error`, so nobody reads a provider outage as "no email yet"."""
    if status is Status.WAITING:
        if last_outcome in (CheckOutcome.PROVIDER_ERROR, CheckOutcome.CIRCUIT_OPEN):
            return Result.PROVIDER_ERROR
        return Result.WAITING
    return Result(status.value)
