"""The doorbell: send Celery tasks that carry only ids.

A failed send is logged, never raised to the caller: the database says what
is due, and the sweep re-sends what a lost send left behind.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from app.infra import queue
from app.infra.redis import redis_client
from app.observability.logs import failure_extra

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("signalbox.dispatch")


def _celery() -> Celery:
    # The Celery app is built from settings only when a task is first sent.
    return queue.get_celery()


def _send(
    task: str,
    object_id: str,
    queue_name: str,
    *,
    message: str,
    fields: dict[str, str],
    logger: logging.Logger = log,
) -> bool:
    """Send `task` with the one id it carries; False (logged) when the broker
    refuses. The caller says what the log line carries."""
    try:
        _celery().send_task(task, args=[object_id], queue=queue_name)
        return True
    except Exception as exc:
        logger.warning(
            message, extra={"event": "send_failed", **fields, "error": type(exc).__name__}
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
    return _send(
        queue.CHECK_TASK,
        signal_id,
        queue.SIGNALS_QUEUE,
        message="check task not sent; the sweep will send it again",
        fields={"task": queue.CHECK_TASK, "signal_id": signal_id},
    )


# First-look tickets (Redis). A check takes every due signal of its provider,
# so a burst of creates needs one first-look task per provider, not one each:
#   ticket:{provider}  -> the signal id whose task holds the ticket
#   holder:{signal id} -> its provider (so the task, which carries only the
#                         id, can hand the ticket back)
# A create sends a task only if it gets the ticket; the task hands it back
# before it takes its batch. A create asks for the ticket after its commit,
# so one that is refused is committed before the holder's batch is taken and
# rides in it (docs/api.md, "The first look"). Redis unreachable: every
# create sends its own task, as before.
_TICKET = "signalbox:first_look:ticket:"
_HOLDER = "signalbox:first_look:holder:"
_TAKE_TICKET = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
    return 1
end
return 0
"""
_RETURN_TICKET = """
local provider = redis.call('GET', KEYS[1])
if not provider then return 0 end
redis.call('DEL', KEYS[1])
local ticket = ARGV[2] .. provider
if redis.call('GET', ticket) == ARGV[1] then redis.call('DEL', ticket) end
return 1
"""


def _tickets() -> Any:
    return redis_client()


def enqueue_first_look(provider: str, signal_id: str, ttl_seconds: float) -> bool:
    """Ring for the first look of a new, committed signal: a task, unless a
    task of `provider` is already on its way (it takes this signal too). The
    ticket lapses after `ttl_seconds` if its task is lost; the sweep re-sends
    what a lost task left, as for any lost task."""
    try:
        took = _tickets().eval(
            _TAKE_TICKET,
            2,
            _TICKET + provider,
            _HOLDER + signal_id,
            signal_id,
            provider,
            max(1, int(ttl_seconds * 1000)),
        )
    except Exception as exc:  # no ticket to be had: a task each, as before
        log.info(
            "first-look ticket unavailable; sending the task",
            extra={
                "event": "first_look_ticket_failed",
                "signal_id": signal_id,
                "error": type(exc).__name__,
            },
        )
        took = 1
    if not took:
        return True
    if enqueue_check(signal_id):
        return True
    first_look_started(signal_id)  # nothing is on its way: the next create sends
    return False


def first_look_started(signal_id: str) -> None:
    """A check task of `signal_id` begins: hand back the first-look ticket it
    holds, if any (before it takes its batch). Never raises."""
    try:
        _tickets().eval(_RETURN_TICKET, 1, _HOLDER + signal_id, signal_id, _TICKET)
    except Exception as exc:
        log.info(
            "first-look ticket not returned; it lapses",
            extra=failure_extra("first_look_return_failed", exc, signal_id=signal_id),
        )


def publish_dead_letter(dead_letter_id: str) -> bool:
    """Put a dead letter on the `dead_letter` queue for consumers that alert."""
    return _send(
        queue.DEAD_LETTER_TASK,
        dead_letter_id,
        queue.DEAD_LETTER_QUEUE,
        message="dead letter not sent; the sweep will send it again",
        fields={"task": queue.DEAD_LETTER_TASK, "dead_letter_id": dead_letter_id},
    )


def enqueue_webhook(dead_letter_id: str) -> bool:
    """Ring for one attempt at POSTing a dead letter to the webhook."""
    return _send(
        queue.WEBHOOK_TASK,
        dead_letter_id,
        queue.SIGNALS_QUEUE,
        message="webhook task not sent; the next poll sends it again",
        fields={"dead_letter_id": dead_letter_id},
        logger=logging.getLogger("signalbox.webhooks"),
    )
