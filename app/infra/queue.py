"""The Celery app as every process sees it: the broker, the queues, the task
names and their routes, in one place.

Producers (the API, the sink, beat's in-process sweep, the webhook outbox)
send by task name through `app.infra.dispatch`; the worker front door
(`workers.celery_app`) adds what only workers and beat need (the tasks, their
time limits, the beat schedule). Tasks carry only ids (the database is the
truth). `acks_late` with `task_reject_on_worker_lost` re-queues a task whose
worker process died; when the whole worker dies the sweep re-sends what is
due. No task is ever sent with a long countdown: Redis' visibility timeout
would redeliver it.
"""

from __future__ import annotations

import threading

from celery import Celery
from kombu import Exchange, Queue

from app.settings import Settings, get_settings

SIGNALS_QUEUE = "signals"
DEAD_LETTER_QUEUE = "dead_letter"

CHECK_TASK = "signalbox.check"
SWEEP_TASK = "signalbox.sweep"
LATE_WATCH_TASK = "signalbox.late_watch"
RETENTION_TASK = "signalbox.retention"
DEAD_LETTER_TASK = "signalbox.dead_letter"
WEBHOOK_TASK = "signalbox.webhook"
WEBHOOK_DUE_TASK = "signalbox.webhook_due"

_lock = threading.Lock()
_app: Celery | None = None


def make_celery(settings: Settings) -> Celery:
    """A Celery app on the configured broker, with Signalbox's queues and routes."""
    app = Celery("signalbox", broker=settings.broker_url)
    app.conf.update(
        task_default_queue=SIGNALS_QUEUE,
        task_queues=(
            Queue(SIGNALS_QUEUE, Exchange(SIGNALS_QUEUE), routing_key=SIGNALS_QUEUE),
            Queue(DEAD_LETTER_QUEUE, Exchange(DEAD_LETTER_QUEUE), routing_key=DEAD_LETTER_QUEUE),
        ),
        task_routes={
            DEAD_LETTER_TASK: {"queue": DEAD_LETTER_QUEUE},
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
    )
    return app


def get_celery() -> Celery:
    """This process's Celery app, built from settings on first use."""
    global _app
    with _lock:
        if _app is None:
            _app = make_celery(get_settings())
        return _app
