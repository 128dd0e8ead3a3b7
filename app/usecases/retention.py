"""Retention (the `signalbox.retention` beat task): delete what is old, in batches.

Two horizons:

* ``SIGNALBOX_RETENTION_HOURS`` (72): mail content and check history — the
  sink's messages, observed messages no signal points at, checks of signals
  that are over, and the bodies of consumed signals' messages;
* ``SIGNALBOX_EVIDENCE_RETENTION_HOURS`` (90 days): the evidence — receipts,
  resolved dead letters and terminal signals (with what cascades from them),
  and address holds released that long ago.

A mailbox past its ``expires_at`` is deleted on the next run (its address
stays its namespace's), but its mail is not purged with it: the mail ages out
with the content horizon like any other, so a failed test's mailbox, which
the test clients keep, stays readable until ``SIGNALBOX_RETENTION_HOURS``.
``DELETE /v1/mailboxes/{id}`` is the purge.

A signal still in play (waiting, found, claimed) loses nothing: not its
checks, not its message, not the mail it could still match. A `found`
signal nobody claimed within the content horizon is no longer in play: it
is deleted with its content. Open dead
letters stay until an operator resolves them. Each batch is its own short
transaction; a run stops after `max_batches` per kind so that one run never
monopolises a worker, and the next run continues.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import Connection

from app.db import mailboxes as mailboxes_db
from app.db import retention as retention_db
from app.db.engine import transaction
from app.settings import Settings

log = logging.getLogger("signalbox.retention")

BATCH_SIZE = 1000
MAX_BATCHES = 200

_Step = Callable[..., int]


def _drain(step: _Step, *, older_than_hours: float, batch_size: int, max_batches: int) -> int:
    total = 0
    for _ in range(max_batches):
        with transaction() as session:
            done = step(session, older_than_hours=older_than_hours, limit=batch_size)
        total += done
        if done < batch_size:
            break
    return total


def _expire_mailboxes(session: Connection, *, older_than_hours: float, limit: int) -> int:
    """Mailboxes whose expires_at passed: deleted; their mail stays until
    the content horizon (retention purges it by owner, as any sink mail)."""
    return len(mailboxes_db.mailbox_expire_due(session, limit))


def purge(
    settings: Settings, *, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES
) -> dict[str, int]:
    """Apply both horizons; return how many rows of each kind were deleted (or purged)."""
    began = time.monotonic()
    content = settings.retention_hours
    evidence = settings.evidence_retention_hours
    # Evidence first: signals deleted here free their messages for the content pass.
    plan: list[tuple[str, _Step, float]] = [
        # A mailbox past its expires_at is deleted; its mail keeps to the content horizon.
        ("mailboxes", _expire_mailboxes, 0.0),
        ("receipts", retention_db.receipt_delete_old, evidence),
        ("dead_letters", retention_db.dead_letter_delete_old, evidence),
        ("signals", retention_db.signal_delete_old, evidence),
        ("address_holds", retention_db.hold_delete_old, evidence),
        # A found signal nobody claims ends with its content.
        ("found_signals", retention_db.signal_delete_unclaimed_found, content),
        ("checks", retention_db.check_delete_old, content),
        ("message_bodies", retention_db.message_purge_consumed_raw, content),
        ("messages", retention_db.message_delete_old, content),
        ("sink_messages", retention_db.sink_message_delete_old, content),
        ("smtp_refusals", retention_db.smtp_refusal_delete_old, content),
    ]
    counts: dict[str, int] = {}
    for name, step, hours in plan:
        counts[name] = _drain(
            step, older_than_hours=hours, batch_size=batch_size, max_batches=max_batches
        )
    log.info(
        "retention run",
        extra={
            "event": "retention_purged",
            "deleted": counts,
            "duration_ms": round((time.monotonic() - began) * 1000),
        },
    )
    return counts
