"""What a signal expects of its mail, decided on one look at the provider: pure.

A signal's `expect` says which question it answers (docs/api.md, "Assertions"):

- `first` (the default): the earliest matching message makes it `found`
  (the matcher's pick, `app.domain.matching.pick`; nothing here);
- `exactly_one`: `found` only once one matching message is there and no
  second one arrived within `settle_seconds` after it (or before the
  deadline, if that comes first); a second one in that time expires the
  signal with `duplicate_messages`;
- `none`: a matching message before the deadline makes it `arrived` at once;
  a final look (one that began at or after the deadline) that finds none
  makes it `absent`.

`decide` takes what one look saw (the matching messages, oldest first, all
received by the deadline) and when the look began, and says what follows.
Nothing is remembered between looks: every look at the window sees every
message in it, so each decision is made afresh from what is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from app.domain.moments import as_utc, rounded_span

__all__ = [
    "Absent",
    "Arrival",
    "Arrived",
    "Decision",
    "Duplicate",
    "Expect",
    "Settle",
    "Take",
    "Undecided",
    "arrived_sentence",
    "decide",
    "duplicate_sentence",
    "effective_settle",
]


class Expect(StrEnum):
    FIRST = "first"
    EXACTLY_ONE = "exactly_one"
    NONE = "none"


DEFAULT_SETTLE_SECONDS = 5
MIN_SETTLE_SECONDS = 1
MAX_SETTLE_SECONDS = 300


def effective_settle(expect: Expect, settle_seconds: int | None) -> int | None:
    """The settle time a signal keeps: the given one (or the default) for
    `exactly_one`, none for the others."""
    if expect is not Expect.EXACTLY_ONE:
        return None
    return DEFAULT_SETTLE_SECONDS if settle_seconds is None else settle_seconds


@dataclass(frozen=True)
class Arrival:
    """A message that matches the signal (every rule of the matcher)."""

    message_id: str
    received_at: datetime


@dataclass(frozen=True)
class Undecided:
    """Nothing follows from this look: the signal waits on its usual schedule
    (and the deadline decides as for any signal)."""


@dataclass(frozen=True)
class Settle:
    """`exactly_one`: one match is there, but a second may still come; the
    look that decides begins at or after `until`."""

    first: Arrival
    until: datetime


@dataclass(frozen=True)
class Take:
    """Found with this message."""

    arrival: Arrival


@dataclass(frozen=True)
class Duplicate:
    """`exactly_one`: a second matching message within the settle time."""

    first: Arrival
    second: Arrival

    @property
    def seconds_apart(self) -> float:
        return (as_utc(self.second.received_at) - as_utc(self.first.received_at)).total_seconds()


@dataclass(frozen=True)
class Arrived:
    """`none`: a matching message came before the deadline."""

    arrival: Arrival


@dataclass(frozen=True)
class Absent:
    """`none`: the final look found no matching message."""


Decision = Undecided | Settle | Take | Duplicate | Arrived | Absent


def decide(
    expect: Expect,
    arrivals: Sequence[Arrival],
    *,
    looked_at: datetime,
    deadline: datetime,
    settle_seconds: int | None = None,
    precision: timedelta = timedelta(0),
) -> Decision:
    """What follows a look that saw the provider (a failed look decides nothing).

    `arrivals` are the matching messages the look saw, received by the
    deadline, in any order. `looked_at` is when the look began. `precision`
    is the resolution of the provider's stamps (MailDev, IMAP: one second): a
    message stamped at t arrived before t + precision, so its settle time
    ends `precision` later than its stamp says, and gaps are measured on the
    stamps.
    """
    ordered = sorted(arrivals, key=lambda a: (as_utc(a.received_at), a.message_id))
    looked_at, deadline = as_utc(looked_at), as_utc(deadline)
    if expect is Expect.FIRST:
        return Take(ordered[0]) if ordered else Undecided()
    if expect is Expect.NONE:
        if ordered:
            return Arrived(ordered[0])
        # Only a look that began at or after the deadline saw the whole window.
        return Absent() if looked_at >= deadline else Undecided()
    if not ordered:
        return Undecided()
    first = ordered[0]
    settle = timedelta(seconds=effective_settle(expect, settle_seconds) or 0)
    if len(ordered) > 1 and as_utc(ordered[1].received_at) - as_utc(first.received_at) <= settle:
        return Duplicate(first, ordered[1])
    until = min(as_utc(first.received_at) + max(precision, timedelta(0)) + settle, deadline)
    if looked_at < until:
        return Settle(first, until)
    return Take(first)


# --------------------------------------------------------------------------- sentences


def duplicate_sentence(seconds_apart: float, settle_seconds: int | None) -> str:
    """The recommendation of a `duplicate_messages` dead letter."""
    settle = f" (settle_seconds {settle_seconds})" if settle_seconds else ""
    return (
        f"Two matching messages arrived {_gap(seconds_apart)} apart{settle}, where exactly "
        "one was expected: the application sent the email twice (a double submit, a retry "
        "that mails again); make it send once, or narrow subject_contains if the two are "
        "different emails."
    )


def arrived_sentence(seconds_after_window: float) -> str:
    """The recommendation of an `arrived` signal (`expect: none`)."""
    return (
        f"A matching message arrived {_gap(seconds_after_window)} after the window opened, "
        "where none was expected: find what sent it (the application should not mail in "
        "this case), or narrow the filters if it is a different email."
    )


def _gap(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.1f} s"
    return rounded_span(seconds)
