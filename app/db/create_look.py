"""The first look a sink signal's create makes in its own statement
(`app.db.signals.signal_create_if_clear` with `look`): the fragments that
statement adds to a plain create, and the look's parameters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FirstLook:
    """The first look a sink signal's create makes in its own statement
    (`signal_create_if_clear`), as the one-statement look would write it:
    whether it spends a check of the budget, its next check's reason, the
    near-miss lookback before the window and the check row's batch."""

    counted: bool
    next_reason: str
    lookback_seconds: float
    batch_id: str


# The create of a sink signal that also makes its first look (see
# `signal_create_if_clear`, `look`): the recipient's mail the look could see,
# searched in the create's snapshot as `takes._FIRST_LOOK_EMPTY` searches it,
# and, when there is none, the signal inserted as that look leaves it (its
# fence taken, one look that found nothing, the next check the deadline's)
# with the look's check row.
LOOK_MAIL = """
    ), mail AS (
        SELECT 1
          FROM clear,
               LATERAL (SELECT received_at FROM sink_messages
                         WHERE all_recipients && ARRAY[CAST(:address AS text)]::text[]
                        OFFSET 0) sm
         WHERE sm.received_at >= coalesce(CAST(:received_after AS timestamptz), clear.now)
                                 - make_interval(secs => :look_lookback)
         LIMIT 1
    ), looked AS (
        SELECT NOT EXISTS (SELECT 1 FROM mail) AS empty
"""


def looked(now: str, due: str) -> dict[str, str]:
    """What the create's first look changes in the signal's insert
    (`app.db.signals.insert_signal`; `now`: the create's clock, `due`: the
    first check a plain create sets): when it found nothing (`looked.empty`),
    the next check the deadline's, its fence taken, one look, its times and
    outcome."""
    return {
        "due": f"CASE WHEN looked.empty THEN {now} + make_interval(secs => :expires_in)"
        f" ELSE {due} END",
        "reason": "CASE WHEN looked.empty THEN CAST(:look_next_reason AS text) ELSE 'first' END",
        "looked_columns": ", check_fence, checks_count, last_check_at, last_look_at, last_outcome",
        "looked_values": f""",
        CASE WHEN looked.empty THEN 1 ELSE 0 END,
        CASE WHEN looked.empty AND :look_counted THEN 1 ELSE 0 END,
        CASE WHEN looked.empty THEN clock_timestamp() END,
        CASE WHEN looked.empty THEN {now} END,
        CASE WHEN looked.empty THEN 'no_match' END""",
    }


LOOK_CHECK = """
    ), look_check AS (
        INSERT INTO checks (signal_id, generation, fence, provider, reason, outcome,
                            error_code, batch_id, started_at, finished_at, counted,
                            messages_seen)
        SELECT c.id, c.generation, c.check_fence, c.provider, 'first', 'no_match', NULL,
               :look_batch, c.last_look_at, c.last_check_at, :look_counted, 0
          FROM created c WHERE c.last_outcome = 'no_match'
"""
