"""The inbox's live events: one feed per API process, fed by the
notification listener (`app/api/notify.py`), fanned out to every open
`GET /v1/messages/events` stream and console inbox.

A subscriber is an asyncio queue and a namespace: no thread, no database
connection and no polling loop of its own. The listener hands each recorded
message's id to the feed's one thread, which gathers the ids that arrived
meanwhile, reads their list items and who they belong to in one transaction
(`app.usecases.inbox.event_items`), and puts each item on the queues of the
namespaces that may see it. A subscriber that does not keep up loses events
(its queue is bounded), never memory.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from app.usecases import inbox

log = logging.getLogger("signalbox.api.inbox_feed")

# Events waiting per subscriber before newer ones are dropped.
QUEUE_EVENTS = 256
# Ids read per transaction.
BATCH_IDS = 500


class Subscriber:
    __slots__ = ("dropped", "loop", "namespace", "queue")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_EVENTS)
        self.dropped = 0

    def offer(self, item: dict[str, Any]) -> None:
        """On the subscriber's loop: queue the event, or count it dropped."""
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1


class InboxFeed:
    def __init__(self) -> None:
        self._ids: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._subscribers: set[Subscriber] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inbox-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._ids.put(None)
        if self._thread is not None:
            self._thread.join(timeout=3)

    def notified(self, message_id: str | None) -> None:
        """From the listener thread: a message was recorded (None: reconnected)."""
        if message_id is not None and self.subscribers:
            self._ids.put(message_id)

    @asynccontextmanager
    async def subscribe(self, namespace: str) -> AsyncIterator[Subscriber]:
        subscriber = Subscriber(namespace)
        with self._lock:
            self._subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            with self._lock:
                self._subscribers.discard(subscriber)

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self._ids.get()
            if first is None:
                continue
            ids = [first]
            while len(ids) < BATCH_IDS:
                try:
                    more = self._ids.get_nowait()
                except queue.Empty:
                    break
                if more is not None:
                    ids.append(more)
            try:
                self._deliver(ids)
            except Exception as exc:  # the next notification tries again
                log.warning(
                    "inbox events could not be read",
                    extra={"event": "inbox_feed_failed", "error": type(exc).__name__},
                )

    def _deliver(self, ids: list[str]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        if not subscribers:
            return
        namespaces = {s.namespace for s in subscribers}
        seen = inbox.event_items(ids, namespaces)
        for subscriber in subscribers:
            for item in seen.get(subscriber.namespace, ()):
                subscriber.loop.call_soon_threadsafe(subscriber.offer, item)
