"""Repository of cancellations: a producer ends a signal that has not ended.

`waiting`, `found` or `claimed` → `cancelled`, one guarded UPDATE; an active
claim of the signal ends with it (state `cancelled`). The claim row is locked
before the signal's, the order a consume takes them in, so a cancel and a
consume at the same moment queue instead of deadlocking.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.db import runner
from app.db.records import ClaimIdRow, SignalRow
from app.db.runner import Statement
from app.domain.states import CANCELS, Status

_LOCK_ACTIVE: Statement[ClaimIdRow] = Statement(
    "claim_lock_active_for_signal",
    "SELECT id FROM claims WHERE signal_id = :id AND state = 'active' FOR UPDATE",
)


def claim_lock_active_for_signal(session: Connection, signal_id: str) -> str | None:
    """Lock the signal's active claim (if any) and return its id."""
    row = runner.one(session, _LOCK_ACTIVE, {"id": signal_id})
    return None if row is None else row["id"]


_CANCEL: Statement[SignalRow] = Statement(
    "signal_cancel",
    """
            UPDATE signals
               SET status = :dst, cancel_reason = :reason, cancelled_at = now(),
                   -- A check or a claim still in flight is fenced out.
                   check_fence = check_fence + 1, claim_fence = claim_fence + 1,
                   next_check_at = NULL, check_lease_until = NULL, updated_at = now()
             WHERE id = :id AND namespace = :namespace
               AND status = ANY(:srcs)
             RETURNING *
            """,
)
_END_CANCELLED: Statement = Statement(
    "claim_end_cancelled",
    "UPDATE claims SET state = 'cancelled', ended_at = now()"
    " WHERE signal_id = :id AND state = 'active'",
)


def signal_cancel(
    session: Connection, signal_id: str, namespace: str, reason: str
) -> SignalRow | None:
    """`waiting`/`found`/`claimed` → `cancelled` with `reason`; the row, or
    None when the signal is not this namespace's or has another status."""
    return runner.one(
        session,
        _CANCEL,
        {
            "id": signal_id,
            "namespace": namespace,
            "reason": reason,
            "dst": Status.CANCELLED.value,
            # Every source the state machine draws an arrow to `cancelled` from.
            "srcs": [t.src.value for t in CANCELS],
        },
    )


def claim_end_cancelled(session: Connection, signal_id: str) -> int:
    """End the signal's active claims (state `cancelled`); how many."""
    return runner.exec(session, _END_CANCELLED, {"id": signal_id})
