"""The doorbell: send Celery tasks that carry only ids.

A failed send is logged, never raised to the caller: the database says what
is due, and the sweep re-sends what a lost send left behind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("signalbox.dispatch")

SIGNALS_QUEUE = "signals"
CHECK_TASK = "signalbox.check"
DEAD_LETTER_TASK = "signalbox.dead_letter"


def _celery() -> Celery:
    # Imported late: the API and the sink import this module, and the Celery
    # app is built from settings only when a task is first sent.
    from workers.celery_app import get_celery

    return get_celery()


def _send(task: str, object_id: str, queue: str, what: str) -> bool:
    try:
        _celery().send_task(task, args=[object_id], queue=queue)
        return True
    except Exception as exc:
        key = "signal_id" if queue == "signals" else "dead_letter_id"
        log.warning(
            f"{what} not sent; the sweep will send it again",
            extra={
                "event": "send_failed",
                "task": task,
                key: object_id,
                "error": type(exc).__name__,
            },
        )
        return False


def warm() -> bool:
    """Build the Celery app and open a producer connection to the broker now,
    not with the first task sent. False (logged) when the broker is down."""
    try:
        with _celery().producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1)
        return True
    except Exception as exc:
        log.warning(
            "broker not reachable at start; the first task will connect",
            extra={"event": "broker_warm_failed", "error": type(exc).__name__},
        )
        return False


def queue_depth(queue: str) -> int | None:
    """How many tasks wait in `queue` (not those a worker holds); None when
    the broker cannot say."""
    try:
        # A pooled connection: the sweep asks every tick, and must not open
        # a new broker connection each time.
        with _celery().pool.acquire(block=True, timeout=5) as conn:
            channel = conn.default_channel
            try:
                _, count, _ = channel.queue_declare(queue=queue, passive=True)
            except conn.channel_errors:
                return 0  # the queue does not exist (yet): nothing waits in it
            return int(count)
    except Exception as exc:
        log.warning(
            "queue depth unknown",
            extra={"event": "queue_depth_failed", "queue": queue, "error": type(exc).__name__},
        )
        return None


def enqueue_check(signal_id: str) -> bool:
    """Ring for a check of `signal_id` (and whatever else is due on its provider)."""
    return _send(CHECK_TASK, signal_id, "signals", "check task")


def publish_dead_letter(dead_letter_id: str) -> bool:
    """Put a dead letter on the `dead_letter` queue for consumers that alert."""
    return _send(DEAD_LETTER_TASK, dead_letter_id, "dead_letter", "dead letter")
