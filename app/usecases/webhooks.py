"""Use cases of the dead-letter webhook: every new dead letter is POSTed to
SIGNALBOX_DEAD_LETTER_WEBHOOK_URL, signed, with retries for a day.

An outbox: `delivery_record` inserts the delivery in the transaction that
records the dead letter, so none is lost between them. `deliver_due` (beat)
sends a task per due delivery; `deliver` (the task) takes the delivery under a
lease, POSTs with no lock held, and writes the outcome guarded by the attempt
number. A success is written once and never sent again; a worker that dies
after the receiver answered 2xx but before the write leaves the delivery to
be sent once more when its lease lapses (at least once: receivers dedupe on
`dead_letter_id`, also sent as `X-Signalbox-Delivery`).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection

from app.db import dead_letters as dead_letters_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db import webhooks as webhooks_db
from app.db.engine import transaction
from app.domain import webhooks as rules
from app.infra import dispatch, webhook_post
from app.observability import metrics
from app.settings import Settings, get_settings

log = logging.getLogger("signalbox.webhooks")

# A task sent but not taken within this time is presumed lost and sent again.
REQUEUE_AFTER_SECONDS = 60.0


def delivery_record(session: Connection, dead_letter_id: str | None) -> None:
    """In the dead letter's own transaction: queue its webhook delivery
    (nothing when no webhook is configured or the dead letter was not new)."""
    if dead_letter_id is None or not get_settings().dead_letter_webhook_url:
        return
    dead_letter = dead_letters_db.dead_letter_get(session, dead_letter_id, None)
    signal = signals_db.signal_get(session, dead_letter["signal_id"]) if dead_letter else None
    if dead_letter is None or signal is None:
        return
    webhooks_db.delivery_insert(
        session, dead_letter_id, rules.payload_body(dead_letter, signal["test_case"])
    )


def deliver_due(limit: int = 200) -> int:
    """Send a task for each due delivery (run by beat). Returns how many."""
    if not get_settings().dead_letter_webhook_url:
        return 0
    with transaction() as session:
        due = webhooks_db.delivery_mark_due_enqueued(
            session, requeue_after_seconds=REQUEUE_AFTER_SECONDS, limit=limit
        )
    return sum(1 for dead_letter_id in due if dispatch.enqueue_webhook(dead_letter_id))


def deliver(dead_letter_id: str, settings: Settings | None = None) -> str:
    """One attempt at the delivery of `dead_letter_id`. Returns the outcome:
    `delivered`, `failed` (will retry), `gave_up`, or `skipped` (not due,
    held by another worker, or already done)."""
    settings = settings or get_settings()
    lease = settings.webhook_timeout_seconds + 30.0
    with transaction() as session:
        row = webhooks_db.delivery_take(session, dead_letter_id, lease_seconds=lease)
    if row is None or not settings.dead_letter_webhook_url:
        return "skipped"
    status, error = _post(settings, row["body"], dead_letter_id)
    with transaction() as session:
        if status is not None and rules.is_success(status):
            written = webhooks_db.delivery_mark_delivered(
                session, row["id"], row["attempts"], status=status
            )
            outcome = "delivered"
        else:
            now = server_db.db_now(session)
            delay = rules.retry_delay(
                row["attempts"],
                base=settings.webhook_backoff_base_seconds,
                cap=settings.webhook_backoff_cap_seconds,
            )
            next_at = now + timedelta(seconds=delay)
            give_up = rules.gives_up(
                row["created_at"],
                next_at,
                row["attempts"],
                retry_hours=settings.webhook_retry_hours,
            )
            written = webhooks_db.delivery_mark_failed(
                session,
                row["id"],
                row["attempts"],
                status=status,
                error=error or f"HTTP {status}",
                next_attempt_at=next_at,
                give_up=give_up,
            )
            outcome = "gave_up" if give_up else "failed"
    if not written:  # our lease lapsed and another attempt owns the row now
        return "skipped"
    metrics.webhook_delivery(outcome)
    log_at = log.info if outcome == "delivered" else log.warning
    log_at(
        f"dead-letter webhook {outcome}",
        extra={
            "event": f"webhook_{outcome}",
            "dead_letter_id": dead_letter_id,
            "attempt": row["attempts"],
            "http_status": status,
            "error": error,
        },
    )
    return outcome


def _post(settings: Settings, body: str, dead_letter_id: str) -> tuple[int | None, str | None]:
    """POST the body; (HTTP status, None) or (None, the error's kind)."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "signalbox-webhook/1",
        "X-Signalbox-Delivery": dead_letter_id,
    }
    if settings.dead_letter_webhook_secret:
        # `t` is this attempt's time: each retry is signed afresh, so a
        # receiver's 5-minute window holds however long the retries went on.
        headers[rules.SIGNATURE_HEADER] = rules.signature(
            body, settings.dead_letter_webhook_secret, int(time.time())
        )
    return webhook_post.post_within(
        settings.dead_letter_webhook_url,
        body.encode(),
        headers,
        settings.webhook_timeout_seconds,
    )


_warned = False


def warn_if_unsigned(settings: Settings | None = None) -> bool:
    """At the start of a process that delivers (worker, beat): log one
    `webhook_unsigned` warning if a webhook URL is set without a secret.
    True if it warned (now or earlier in this process)."""
    global _warned
    settings = settings or get_settings()
    message = rules.unsigned_warning(
        settings.dead_letter_webhook_url, settings.dead_letter_webhook_secret
    )
    if message is None:
        return False
    if not _warned:
        _warned = True
        # The message names the settings, never the URL: it may carry a secret.
        log.warning(message, extra={"event": "webhook_unsigned"})
    return True


def delivery_status(namespace: str | None) -> dict[str, Any]:
    """For the console: deliveries by state and the latest failing ones."""
    with transaction() as session:
        counts = webhooks_db.delivery_count_by_state(session, namespace)
        failing = webhooks_db.delivery_list_failing(session, namespace, 20)
    return {
        "configured": bool(get_settings().dead_letter_webhook_url),
        "by_state": counts,
        "failing": [
            {
                "dead_letter_id": r["dead_letter_id"],
                "namespace": r["namespace"],
                "state": r["state"],
                "attempts": r["attempts"],
                "last_status": r["last_status"],
                "last_error": r["last_error"],
                "last_attempt_at": r["last_attempt_at"],
                "next_attempt_at": r["next_attempt_at"],
            }
            for r in failing
        ],
    }
