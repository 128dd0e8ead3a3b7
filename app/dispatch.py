"""The doorbell: send Celery tasks that carry only ids.

A failed send is logged, never raised to the caller: the database says what
is due, and the sweep re-sends what a lost send left behind.
"""

from __future__ import annotations

import logging

log = logging.getLogger("signalbox.dispatch")

CHECK_TASK = "signalbox.check"
DEAD_LETTER_TASK = "signalbox.dead_letter"


def _celery():  # type: ignore[no-untyped-def]
    from workers.celery_app import get_celery

    return get_celery()


def enqueue_check(signal_id: str) -> bool:
    try:
        _celery().send_task(CHECK_TASK, args=[signal_id], queue="signals")
        return True
    except Exception:
        log.warning(
            "check task not sent; the sweep will re-send it",
            extra={"event": "enqueue_failed", "signal_id": signal_id},
            exc_info=True,
        )
        return False


def publish_dead_letter(dead_letter_id: str) -> bool:
    try:
        _celery().send_task(DEAD_LETTER_TASK, args=[dead_letter_id], queue="dead_letter")
        return True
    except Exception:
        log.warning(
            "dead letter not published; the sweep will re-publish it",
            extra={"event": "dead_letter_publish_failed", "dead_letter_id": dead_letter_id},
            exc_info=True,
        )
        return False
