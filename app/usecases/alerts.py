"""The dead-letter alert: a structured log line an alerting pipeline picks
up, raised once per dead letter. Content never goes in it."""

from __future__ import annotations

import logging
from typing import Any

from app.db import dead_letters as dead_letters_db
from app.db.engine import transaction

# The worker task's logger: alerting pipelines select the line by this name.
log = logging.getLogger("signalbox.tasks")


def raise_alert(dead_letter_id: str) -> dict[str, Any]:
    """Raise the alert of `dead_letter_id` unless it was raised already.

    Returns `dead_letter_id`, `found`, `alerted` and, when alerted, `reason`.
    The alert is taken in a transaction and raised after its commit: a raise
    that a failed commit would repeat could not be taken back, so a dead
    letter delivered twice (the outbox publishes again when marking it
    published failed) alerts once."""
    with transaction() as session:
        row = dead_letters_db.dead_letter_take_alert(session, dead_letter_id)
        if row is None:  # alerted already, or no such dead letter
            found = dead_letters_db.dead_letter_get(session, dead_letter_id, None) is not None
            return {"dead_letter_id": dead_letter_id, "found": found, "alerted": False}
    log.warning(
        "dead letter",
        extra={
            "event": "dead_letter_alert",
            "dead_letter_id": dead_letter_id,
            "signal_id": row["signal_id"],
            "run_id": row["run_id"],
            "reason": row["reason"],
            "provider": row["provider"],
        },
    )
    return {
        "dead_letter_id": dead_letter_id,
        "found": True,
        "alerted": True,
        "reason": row["reason"],
    }
