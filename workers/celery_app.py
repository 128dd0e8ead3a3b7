"""The Celery app, built from settings: queues, routes, beat schedule.

Tasks carry only ids (the database is the truth). `acks_late` with
`task_reject_on_worker_lost` re-queues a task whose worker process died; when
the whole worker dies the sweep re-sends what is due. No task is ever sent
with a long countdown: Redis' visibility timeout would redeliver it.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from celery import Celery
from kombu import Exchange, Queue

from app.settings import Settings, get_settings
from workers.logging_setup import install as install_observability_hooks

_lock = threading.Lock()
_app: Celery | None = None

# JSON logs for worker and beat, metric-file bookkeeping (before any worker starts).
install_observability_hooks()

SIGNALS_QUEUE = "signals"
DEAD_LETTER_QUEUE = "dead_letter"


def make_celery(settings: Settings) -> Celery:
    app = Celery("signalbox", broker=settings.broker_url, include=["workers.tasks"])
    app.conf.update(
        task_default_queue=SIGNALS_QUEUE,
        task_queues=(
            Queue(SIGNALS_QUEUE, Exchange(SIGNALS_QUEUE), routing_key=SIGNALS_QUEUE),
            Queue(DEAD_LETTER_QUEUE, Exchange(DEAD_LETTER_QUEUE), routing_key=DEAD_LETTER_QUEUE),
        ),
        task_routes={
            "signalbox.dead_letter": {"queue": DEAD_LETTER_QUEUE},
            "signalbox.*": {"queue": SIGNALS_QUEUE},
        },
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        # Flower shows tasks and workers from the workers' events. Producers
        # (API, sink) send no `task-sent` event: one message less per task.
        worker_send_task_events=True,
        task_send_sent_event=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": 3600},
        worker_hijack_root_logger=False,
        # No task runs unbounded: a check's soft limit gives up the provider
        # call (a `timeout` provider error), the hard one replaces the process.
        task_annotations={
            "signalbox.check": {
                "soft_time_limit": settings.check_soft_time_limit_seconds,
                "time_limit": settings.check_time_limit_seconds,
            },
            "signalbox.sweep": {"soft_time_limit": 60, "time_limit": 90},
            "signalbox.retention": {"soft_time_limit": 540, "time_limit": 600},
            "signalbox.dead_letter": {"soft_time_limit": 30, "time_limit": 60},
            "signalbox.late_watch": {"soft_time_limit": 120, "time_limit": 180},
        },
        beat_scheduler="workers.beat:SignalboxScheduler",
        beat_schedule={
            # Run by beat itself (workers.beat): a check backlog cannot starve it.
            "sweep": {
                "task": "signalbox.sweep",
                "schedule": timedelta(seconds=settings.sweep_interval_seconds),
                "options": {"run_in_beat": True},
            },
            "late-watch": {
                "task": "signalbox.late_watch",
                "schedule": timedelta(seconds=settings.late_watch_interval_seconds),
                "options": {"expires": settings.late_watch_interval_seconds},
            },
            "webhooks": {
                "task": "signalbox.webhook_due",
                "schedule": timedelta(seconds=settings.webhook_poll_seconds),
                "options": {"expires": max(5.0, settings.webhook_poll_seconds * 5)},
            },
            "retention": {
                "task": "signalbox.retention",
                "schedule": timedelta(minutes=10),
                "options": {"expires": 300},
            },
        },
    )
    return app


def get_celery() -> Celery:
    global _app
    with _lock:
        if _app is None:
            _app = make_celery(get_settings())
        return _app


app = get_celery()
