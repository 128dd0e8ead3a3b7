"""What a claim's answer is, decided once: the outcomes a claim, a claim
read and a claim's content can have (the front doors map them to codes),
and the pure classification of a claim the guarded statement refused."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from app.domain.expectations import Expect
from app.domain.states import Status


class ClaimOutcome(StrEnum):
    """How a claim, or a read of one, ended."""

    # Leased: the claim's body (content included); a live claim read again,
    # or its message's content.
    CLAIMED = "claimed"
    # No message yet: try again later.
    WAITING = "waiting"
    # The signal expired: nothing to claim, ever (its dead letter says why).
    EXPIRED = "expired"
    # Another claim consumed the message (its receipt).
    ALREADY_CONSUMED = "already_consumed"
    # Another claim holds the message.
    ALREADY_CLAIMED = "already_claimed"
    # The claim read ended: consumed, released or lapsed.
    ENDED = "ended"


class Refusal(StrEnum):
    """Why the claim statement took nothing, from the facts it saw."""

    NOT_FOUND = "not_found"
    RUN_MISMATCH = "run_mismatch"
    # It expects no email, or was cancelled: nothing to claim, ever.
    NOT_CLAIMABLE = "not_claimable"
    # Found but its message row is gone (deleted by hand).
    NO_MESSAGE = "no_message"
    # Claimed under a lease that already lapsed: lapse it, then claim again.
    LEASE_LAPSED = "lease_lapsed"
    # It looked claimable: another writer moved first; run the statement again.
    RACED = "raced"
    WAITING = "waiting"
    EXPIRED = "expired"
    ALREADY_CONSUMED = "already_consumed"
    ALREADY_CLAIMED = "already_claimed"


@dataclass(frozen=True)
class ClaimFacts:
    """What the claim statement saw of the signal when it took nothing
    (`exists` False: no such signal in the namespace)."""

    exists: bool
    run_matches: bool = True
    status: Status = Status.WAITING
    expect: Expect = Expect.FIRST
    has_message: bool = True
    claims_left: bool = True
    # The signal's active claim's lease has lapsed (the sweep has not ended it yet).
    lease_lapsed: bool = False


def claim_refusal(facts: ClaimFacts) -> Refusal:
    """Why a claim took nothing, in the order the contract checks: the
    signal, its run, whether it can ever be claimed, then its state."""
    if not facts.exists:
        return Refusal.NOT_FOUND
    if not facts.run_matches:
        return Refusal.RUN_MISMATCH
    if facts.status is Status.CLAIMED and facts.lease_lapsed:
        return Refusal.LEASE_LAPSED
    if facts.status is Status.FOUND and not facts.has_message:
        return Refusal.NO_MESSAGE
    if facts.expect is Expect.NONE or facts.status is Status.CANCELLED:
        return Refusal.NOT_CLAIMABLE
    if facts.status is Status.FOUND and facts.claims_left:
        return Refusal.RACED
    return _BY_STATUS.get(facts.status, Refusal.ALREADY_CLAIMED)


_BY_STATUS = {
    Status.WAITING: Refusal.WAITING,
    Status.EXPIRED: Refusal.EXPIRED,
    Status.CONSUMED: Refusal.ALREADY_CONSUMED,
}


class ConsumeRefusal(StrEnum):
    """Why the consume statement wrote nothing, from the facts it saw."""

    # Consumed already (this claim): its receipt is the answer again.
    CONSUMED = "consumed"
    # Released, lapsed, or another claim took over: it can never act.
    LAPSED = "lapsed"
    # Live when it looked: another writer held the rows; the statement runs again.
    RACED = "raced"


def consume_refusal(state: str | None, live: bool, current: bool) -> ConsumeRefusal:
    """Why a consume wrote nothing: the claim's `state`, whether its lease
    is `live` and its fence `current` (still the signal's)."""
    if state == "consumed":
        return ConsumeRefusal.CONSUMED
    if state != "active" or not live or not current:
        return ConsumeRefusal.LAPSED
    return ConsumeRefusal.RACED
