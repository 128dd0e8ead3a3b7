"""Thin tasks: load by id → use case → done. Each carries only an id."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from celery import shared_task
from sqlalchemy.exc import InterfaceError, OperationalError

from app.db import dead_letters as dead_letters_db
from app.db.engine import transaction
from app.infra import dispatch
from app.infra.redis import redis_client
from app.providers.breaker import breaker_for
from app.providers.bulkhead import Bulkhead, default_limit
from app.providers.runtime import provider_for
from app.settings import get_settings
from app.usecases import checks, sweep

log = logging.getLogger("signalbox.tasks")


def bulkhead_for(worker: str, provider: str) -> Bulkhead:
    return Bulkhead(
        redis_client(),
        worker,
        provider,
        limit=default_limit(),
        lease_seconds=get_settings().check_lease_seconds,
    )


@shared_task(name="signalbox.check", acks_late=True, bind=True)
def check(self: Any, signal_id: str) -> dict[str, Any]:
    # Before the batch is taken: a create refused the ticket meanwhile is
    # committed, so this check takes it.
    dispatch.first_look_started(signal_id)
    report = checks.run_check(
        get_settings(),
        signal_id,
        provider_for=provider_for,
        breaker_for=breaker_for,
        bulkhead_for=partial(bulkhead_for, self.request.hostname or "worker"),
    )
    if report.signals >= checks.BATCH_LIMIT:
        # A full batch: more may be due (a burst of creates shared one task).
        dispatch.enqueue_check(signal_id)
    return {"signals": report.signals, "outcome": report.outcome, "found": len(report.found)}


@shared_task(name="signalbox.sweep", acks_late=True)
def sweep_task() -> dict[str, int]:
    settings = get_settings()
    report = sweep.sweep(settings, check_here=checks.in_process_check_for(settings))
    return report.__dict__


@shared_task(name="signalbox.late_watch", acks_late=True)
def late_watch() -> dict[str, int]:
    """Look for mail that arrived after its signal expired (one look per provider)."""
    from app.usecases import late

    settings = get_settings()
    return {
        name: late.look(settings, name, provider_for=provider_for, breaker_for=breaker_for)
        for name in late.watched_providers()
    }


@shared_task(name="signalbox.retention", acks_late=True)
def retention() -> dict[str, int]:
    from app.usecases import retention as retention_uc

    return retention_uc.purge(get_settings())


@shared_task(
    name="signalbox.dead_letter",
    acks_late=True,
    # The dead letter is marked published once it is on the queue: an alert
    # this task fails to raise is raised by no one else. A database that is
    # down (restarting, failing over) is waited out, not given up on; the
    # retries' countdowns stay far below the broker's visibility timeout.
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=1,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=None,
)
def dead_letter(dead_letter_id: str) -> dict[str, Any]:
    """The dead-letter queue's consumer: raise the alert (a structured log
    line an alerting pipeline picks up). Content never goes in it.

    Once per dead letter: the outbox publishes a dead letter again when
    marking it published failed, and this task is then delivered twice. The
    alert is raised after the commit that records it (a raise that a failed
    commit would repeat could not be taken back)."""
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


@shared_task(name="signalbox.webhook", acks_late=True)
def webhook(dead_letter_id: str) -> dict[str, str]:
    """One attempt at POSTing a dead letter to the webhook (retries are driven
    by `webhook_due`, never by a countdown)."""
    from app.usecases import webhooks

    return {"dead_letter_id": dead_letter_id, "outcome": webhooks.deliver(dead_letter_id)}


@shared_task(name="signalbox.webhook_due", acks_late=True)
def webhook_due() -> dict[str, int]:
    from app.usecases import webhooks

    return {"sent": webhooks.deliver_due()}
