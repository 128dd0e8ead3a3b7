"""The state machine drawn in docs/api.md is the one the repository enforces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.domain.states import (
    ABSENCE,
    ARRIVAL,
    CLAIM,
    CONSUME,
    FIND,
    GIVE_BACK,
    REDRIVE,
    TRANSITIONS,
    DeadLetterState,
    Status,
    dead_letter_transition,
    transition,
)

DB = Path(__file__).resolve().parents[2] / "app" / "db"


def test_every_named_transition_is_an_arrow_of_the_table() -> None:
    for t in (FIND, CLAIM, GIVE_BACK, CONSUME, REDRIVE, ABSENCE, ARRIVAL):
        assert (t.src, t.dst) in TRANSITIONS


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (Status.CONSUMED, Status.WAITING),
        (Status.CONSUMED, Status.EXPIRED),
        (Status.FOUND, Status.EXPIRED),
        (Status.WAITING, Status.CLAIMED),
        (Status.EXPIRED, Status.FOUND),
        (Status.ABSENT, Status.WAITING),
        (Status.ARRIVED, Status.FOUND),
        (Status.FOUND, Status.ARRIVED),
    ],
)
def test_a_move_the_table_does_not_draw_is_refused(src: Status, dst: Status) -> None:
    with pytest.raises(ValueError, match="no transition"):
        transition(src, dst)


def test_a_resolved_dead_letter_never_moves_again() -> None:
    with pytest.raises(ValueError):
        dead_letter_transition(DeadLetterState.REDRIVEN, DeadLetterState.DISCARDED)
    assert dead_letter_transition(DeadLetterState.OPEN, DeadLetterState.DISCARDED) == (
        "open",
        "discarded",
    )


def test_no_sql_sets_a_status_the_table_did_not_hand_it() -> None:
    """Every signal status change in the repository is `SET status = :dst`
    from a Transition, and every dead letter's `SET state = :dst`; a literal
    in a SET would bypass the table."""
    signal_literal = re.compile(r"SET\s+status\s*=\s*'", re.IGNORECASE)
    state_literal = re.compile(r"SET\s+state\s*=\s*'", re.IGNORECASE)
    offenders = [
        f"{path.name}: {m.group(0)}"
        for path in sorted(DB.glob("*.py"))
        for m in signal_literal.finditer(path.read_text())
    ] + [
        f"dead_letters.py: {m.group(0)}"
        for m in state_literal.finditer((DB / "dead_letters.py").read_text())
    ]
    assert offenders == []
