"""Thin tasks: load by id → use case → done. Each carries only an id."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from sqlalchemy.exc import InterfaceError, OperationalError

from app.providers.breaker import breaker_for
from app.providers.runtime import provider_for
from app.settings import get_settings
from app.usecases import alerts, checks, sweep
from workers.composition import sweep_runner, worker_runner


@shared_task(name="signalbox.check", acks_late=True, bind=True)
def check(self: Any, batch_key: str) -> dict[str, Any]:
    """Check one batch: the due signals of `batch_key`'s provider (that
    signal first, while it is due), at most `checks.BATCH_LIMIT`, in one
    provider call. A full batch sends the next task with the same key."""
    runner = worker_runner(self.request.hostname or "worker")
    report = runner.check(checks.CheckRequest(batch_key, checks.Why.TASK))
    assert report is not None  # a task's check raises rather than give none
    return {"signals": report.signals, "outcome": report.outcome, "found": len(report.found)}


@shared_task(name="signalbox.sweep", acks_late=True)
def sweep_task() -> dict[str, int]:
    report = sweep.sweep(get_settings(), runner=sweep_runner())
    return report.__dict__


@shared_task(name="signalbox.late_watch", acks_late=True)
def late_watch() -> dict[str, int]:
    """Look for mail that arrived after its signal expired (one look per provider)."""
    from app.usecases import late

    settings = get_settings()
    return {
        name: late.find_late_mail(
            settings, name, provider_for=provider_for, breaker_for=breaker_for
        )
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
    """The dead-letter queue's consumer: raise the alert, once per dead
    letter (app.usecases.alerts)."""
    return alerts.raise_alert(dead_letter_id)


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
