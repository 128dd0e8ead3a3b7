"""The worker front door's Celery app: `app.infra.queue`'s app (broker,
queues, routes, task names) plus what only workers and beat need: the thin
tasks of `workers.tasks`, their time limits, and the beat schedule.
`signalbox-server worker|beat|flower` name it to Celery's command line
(`-A workers.celery_app`).
"""

from __future__ import annotations

from datetime import timedelta

from celery import Celery

from app.infra import queue
from app.settings import Settings, get_settings
from workers.logging_setup import install as install_observability_hooks

# JSON logs for worker and beat, metric-file bookkeeping (before any worker starts).
install_observability_hooks()


def configure(app: Celery, settings: Settings) -> Celery:
    """Add the tasks, their limits and the beat schedule to `app`."""
    app.conf.update(
        include=["workers.tasks"],
        # No task runs unbounded: a check's soft limit gives up the provider
        # call (a `timeout` provider error), the hard one replaces the process.
        task_annotations={
            queue.CHECK_TASK: {
                "soft_time_limit": settings.check_soft_time_limit_seconds,
                "time_limit": settings.check_time_limit_seconds,
            },
            queue.SWEEP_TASK: {"soft_time_limit": 60, "time_limit": 90},
            queue.RETENTION_TASK: {"soft_time_limit": 540, "time_limit": 600},
            queue.DEAD_LETTER_TASK: {"soft_time_limit": 30, "time_limit": 60},
            queue.LATE_WATCH_TASK: {"soft_time_limit": 120, "time_limit": 180},
        },
        beat_scheduler="workers.beat:SignalboxScheduler",
        beat_schedule={
            # Run by beat itself (workers.beat): a check backlog cannot starve it.
            "sweep": {
                "task": queue.SWEEP_TASK,
                "schedule": timedelta(seconds=settings.sweep_interval_seconds),
                "options": {"run_in_beat": True},
            },
            "late-watch": {
                "task": queue.LATE_WATCH_TASK,
                "schedule": timedelta(seconds=settings.late_watch_interval_seconds),
                "options": {"expires": settings.late_watch_interval_seconds},
            },
            "retention": {
                "task": queue.RETENTION_TASK,
                "schedule": timedelta(minutes=10),
                "options": {"expires": 300},
            },
            **webhook_schedule(settings),
        },
    )
    return app


def webhook_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    """The webhook outbox's beat entry, only when a webhook is configured:
    without one there is nothing to send, and a task every few seconds would
    only fill the logs and Flower's task list."""
    if not settings.dead_letter_webhook_url:
        return {}
    return {
        "webhooks": {
            "task": queue.WEBHOOK_DUE_TASK,
            "schedule": timedelta(seconds=settings.webhook_poll_seconds),
            "options": {"expires": max(5.0, settings.webhook_poll_seconds * 5)},
        }
    }


def get_celery() -> Celery:
    """The process's Celery app, configured for workers and beat."""
    return app


app = configure(queue.get_celery(), get_settings())
