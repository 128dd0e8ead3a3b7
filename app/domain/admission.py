"""A signal's create, decided once: the create statement inserts when its
facts clear every check, and when it refuses it returns those facts;
`admission` says why, and what the create does next. The outcomes of a
create, which the front doors map to codes, are here too.

The statement decides the quota, the owner, the window and the hold on the
facts it reads (`app.db.signals.signal_create_if_clear`); this module only
classifies a refusal, on the statement's own verdicts, so no rule is
written twice. Two rules need more than one statement, and end here in a
step the use case runs before it runs the same statement again:

- the exact quota near the limit: the statement runs again with the exact
  limit under the namespace's lock (creates near it count one at a time);
- another namespace's hold on the address: it is judged on its signals,
  with the hold locked (`hold_lapse`), and released once it lapsed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from app.domain.ownership import hold_lapses_at
from app.domain.states import Status

# Fields whose difference under the same key is a conflict (docs/api.md, "Signals").
CONFLICT_FIELDS = (
    "recipient",
    "test_case",
    "subject_contains",
    "body_contains",
    "provider",
    "expect",
    "settle_seconds",
)


class CreateOutcome(StrEnum):
    """What a create answered with."""

    CREATED = "created"
    # The idempotency key names a signal already, still waiting ...
    EXISTING_WAITING = "existing_waiting"
    # ... or one that stopped waiting.
    EXISTING = "existing"


class Admission(StrEnum):
    """Why the create statement inserted nothing, and what follows."""

    # `received_after` lies before the lookback or after the lookahead.
    TOO_EARLY = "too_early"
    TOO_LATE = "too_late"
    # Another namespace owns the address (a mailbox or an owned domain).
    NOT_OWNED = "not_owned"
    # Another namespace holds it: judged on its signals, the hold locked.
    HELD_BY_OTHER = "held_by_other"
    # The key names a signal: a replay, or a conflict (`conflicting_fields`).
    EXISTING = "existing"
    # Near the quota: counted again exactly, under the namespace's lock.
    COUNT_EXACTLY = "count_exactly"
    # Counted exactly, the quota is reached.
    TOO_MANY = "too_many"
    # Every check cleared but nothing was inserted: another create moved
    # first (took the hold, bound the key); the statement runs again.
    RACED = "raced"


@dataclass(frozen=True)
class CreateFacts:
    """What the create statement saw and its verdicts, when it inserted nothing."""

    now: datetime
    received_after: datetime | None
    # `received_after` in the window, the namespace may use the address,
    # fewer waiting signals than the statement's bound.
    in_window: bool
    owner_ok: bool
    under_bound: bool
    # The address needs a hold (nobody owns or shares it), and who holds it.
    needs_hold: bool
    holder: str | None
    # The signal the idempotency key names (a live binding), if any.
    key_signal: str | None
    # The statement ran with the exact limit, under the namespace's lock.
    counted_exactly: bool


def admission(namespace: str, facts: CreateFacts) -> Admission:
    """Why a create was refused, in the order the contract checks: the window,
    the owner, the hold, then a replay (never refused for the quota), then
    the quota."""
    if not facts.in_window:
        assert facts.received_after is not None  # no window without one
        return Admission.TOO_EARLY if facts.received_after < facts.now else Admission.TOO_LATE
    if not facts.owner_ok:
        return Admission.NOT_OWNED
    if facts.needs_hold and facts.holder is not None and facts.holder != namespace:
        return Admission.HELD_BY_OTHER
    if facts.key_signal is not None:
        return Admission.EXISTING
    if not facts.under_bound:
        return Admission.TOO_MANY if facts.counted_exactly else Admission.COUNT_EXACTLY
    return Admission.RACED


def hold_lapse(
    held_from: datetime, live: bool, last_end: datetime | None, hold: timedelta, now: datetime
) -> datetime | None:
    """When another namespace's hold lapsed (it may then be taken over), or
    None while it stands: one of its signals on the address is live, or its
    last one ended less than `hold` ago."""
    lapses = hold_lapses_at(held_from, last_end, hold)
    return None if live or now < lapses else lapses


def conflicting_fields(
    existing: Mapping[str, Any], values: Mapping[str, Any], fields: Sequence[str] = CONFLICT_FIELDS
) -> list[str]:
    """The fields in which the signal a key names differs from a create's
    `values` (as stored: `settle_seconds` with its default)."""
    return [f for f in fields if existing[f] != values[f]]


def replay_outcome(status: str) -> CreateOutcome:
    """The outcome of a replay of a signal in `status`."""
    return CreateOutcome.EXISTING_WAITING if status == Status.WAITING else CreateOutcome.EXISTING
