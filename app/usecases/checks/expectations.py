"""The writes of a check for a signal that expects `exactly_one` or `none`
(transaction 2, beside `decide`): the pure `app.domain.expectations.decide`
says what the look means, and this writes it, fenced like every check write.

- `Take`: waiting → found (the unique index decides races, as for `first`);
- `Settle`: the check is recorded (`matched`) and the next look is the one
  at the settle time's end;
- `Duplicate`: the check is recorded and the signal expires with
  `duplicate_messages`, its dead letter naming both messages;
- `Arrived`: waiting → arrived with the message (nothing taken);
- `Absent`: waiting → absent with the final look's check row;
- `Undecided`: nothing written here: the caller's usual schedule follows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from app.db import checks as checks_db
from app.db import messages as messages_db
from app.db.checks import CheckRecord
from app.domain.expectations import (
    Absent,
    Arrival,
    Arrived,
    Duplicate,
    Expect,
    Settle,
    Take,
    Undecided,
    decide,
)
from app.domain.masking import mask_subject
from app.domain.matching import evaluate, pick
from app.domain.scheduling import spends_budget
from app.domain.states import (
    ARRIVAL,
    FIND,
    CheckOutcome,
    CheckReason,
    ExpiryReason,
    Status,
    Transition,
)
from app.infra.parse_budget import parse_on_budget
from app.usecases import views
from app.usecases.checks.criteria import candidates_for, criteria_for
from app.usecases.checks.observed import Observed, Parser
from app.usecases.checks.recipient_typos import record_typo_near_misses
from app.usecases.expiry import expire_signal

# A signal as its check took it (`takes_db.signal_lock_for_check`).
_Row = Mapping[Any, Any]


@dataclass
class Written:
    """What `write_expectation` did, for the caller's effects."""

    decided: bool = True  # False: the look decided nothing (`Undecided`)
    outcome: CheckOutcome | None = None  # the check row's outcome; None: nothing written
    event: str | None = None  # log event: signal_found, signal_absent, …
    message_id: str | None = None
    found: bool = False
    dead_letter: str | None = None
    pushed: bool = False
    near_misses: tuple[str, ...] = ()


def write_expectation(
    session: Connection,
    row: _Row,
    observed: list[Observed],
    taken_by: dict[str, str],
    *,
    precision: timedelta,
    looked_at: datetime,
    record: Callable[[CheckOutcome, bool], CheckRecord],
    parse: Parser = parse_on_budget,
) -> Written:
    """Decide and write one `exactly_one` or `none` signal after a look that
    saw the provider. `decided` False when the look decided nothing
    (`Undecided`): the caller schedules the next check as for any signal.

    `record(outcome, counted)` builds the check's row; `taken_by` (message →
    signal of the namespace holding it) is updated when a message is taken.
    """
    expect = Expect(row["expect"])
    criteria = criteria_for(row, precision)
    reason = CheckReason(row["next_check_reason"] or CheckReason.SCHEDULED.value)
    excluded: set[str] = set()
    new_near: list[str] = []
    by_id = {o.message_id: o for o in observed}

    def taken_by_other(mid: str) -> bool:
        return mid in excluded or taken_by.get(mid, row["id"]) != row["id"]

    def mark_found(mid: str, counted: bool, move: Transition) -> bool:
        """Write the matched check, and the signal found (`FIND`) or arrived
        (`ARRIVAL`) with `mid`; False when fenced out."""
        check = record(CheckOutcome.MATCHED, counted)
        return checks_db.signal_mark_found(
            session, row["id"], row["check_fence"], mid, check, move=move
        )

    while True:
        candidates = candidates_for(observed, taken_by_other)
        matching = [c for c in candidates if evaluate(criteria, c).matched]
        matched = {c.message_id for c in matching}
        misses = pick(criteria, [c for c in candidates if c.message_id not in matched]).near_misses
        new_near += messages_db.near_miss_record_many(
            session,
            row["id"],
            [(n.candidate.message_id, n.why.value, n.also) for n in misses],
            fence=row["check_fence"],
        )
        decision = decide(
            expect,
            [Arrival(c.message_id, c.received_at) for c in matching],
            looked_at=looked_at,
            deadline=row["expires_at"],
            settle_seconds=row["settle_seconds"],
            precision=precision,
        )
        if isinstance(decision, Undecided):
            return Written(decided=False, near_misses=tuple(new_near))
        counted = spends_budget(reason, CheckOutcome.MATCHED, None)
        if isinstance(decision, Take):
            mid = decision.arrival.message_id
            try:
                with session.begin_nested():
                    ok = mark_found(mid, counted, FIND)
            except IntegrityError:
                excluded.add(mid)  # another signal took it meanwhile: decide again
                continue
            if ok:
                taken_by[mid] = row["id"]
            return _done(ok, CheckOutcome.MATCHED, "signal_found", mid, new_near, found=ok)
        if isinstance(decision, Arrived):
            mid = decision.arrival.message_id
            ok = mark_found(mid, counted, ARRIVAL)
            return _done(ok, CheckOutcome.MATCHED, "signal_arrived", mid, new_near)
        if isinstance(decision, Absent):
            counted = spends_budget(reason, CheckOutcome.NO_MATCH, None)
            ok = checks_db.signal_mark_absent(
                session, row["id"], row["check_fence"], record(CheckOutcome.NO_MATCH, counted)
            )
            return _done(ok, CheckOutcome.NO_MATCH, "signal_absent", None, new_near)
        # Settle or Duplicate: the check is recorded, the signal still waiting.
        settle_until = decision.until if isinstance(decision, Settle) else None
        written, pushed = checks_db.signal_record_check(
            session,
            row["id"],
            row["check_fence"],
            # The budget caps looks; the settle's last look is never refused for it.
            record(CheckOutcome.MATCHED, counted and row["checks_count"] < row["max_checks"]),
            consecutive_errors=0,
            next_check_at=settle_until,
            next_check_reason=CheckReason.SCHEDULED.value,
        )
        if not written:
            return Written(near_misses=tuple(new_near))
        if isinstance(decision, Settle):
            out = Written(outcome=CheckOutcome.MATCHED, message_id=decision.first.message_id)
            out.pushed, out.near_misses = pushed, tuple(new_near)
            return out
        assert isinstance(decision, Duplicate)
        dead_letter = expire_signal(
            session,
            row["id"],
            expected=Status.WAITING,
            reason=ExpiryReason.DUPLICATE_MESSAGES.value,
            fence=row["check_fence"],
            duplicates=_duplicates(decision, by_id),
            typo_look=partial(record_typo_near_misses, parse=parse),
        )
        out = Written(
            outcome=CheckOutcome.MATCHED,
            event="signal_duplicate_messages",
            message_id=decision.second.message_id,
        )
        out.dead_letter, out.near_misses = dead_letter, tuple(new_near)
        return out


def _done(
    ok: bool,
    outcome: CheckOutcome,
    event: str,
    message_id: str | None,
    near: list[str],
    *,
    found: bool = False,
) -> Written:
    if not ok:  # fenced out (expired, redriven or re-checked meanwhile): not ours to write
        return Written(near_misses=tuple(near))
    return Written(
        outcome=outcome, event=event, message_id=message_id, found=found, near_misses=tuple(near)
    )


def _duplicates(decision: Duplicate, by_id: Mapping[str, Observed]) -> dict[str, Any]:
    """The dead letter's `duplicates`: both messages (subjects masked, as near
    misses') and how far apart they came, in seconds of the provider's stamps."""

    def summary(arrival: Arrival) -> dict[str, Any]:
        seen = by_id.get(arrival.message_id)
        return {
            "message_id": arrival.message_id,
            "received_at": views.iso(arrival.received_at),
            "subject": mask_subject(seen.mail.subject if seen is not None else ""),
        }

    return {
        "messages": [summary(decision.first), summary(decision.second)],
        "seconds_apart": round(decision.seconds_apart, 3),
    }
