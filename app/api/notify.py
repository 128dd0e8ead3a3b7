"""Wake long polls when a signal changes: PostgreSQL LISTEN/NOTIFY.

A trigger on `signals` notifies `signalbox_signal` when a signal stops
waiting (found, arrived, absent or expired), whichever process made the
change: a long poll waits only on a waiting signal (migration 0007). The
payload is the signal's id, and for all but an expiry a space and what its
view is made of (migration 0018), so the long poll answers without reading
the signal again. One listener thread per API process fans the
notifications out to the waiting requests' doorbells (`Wake`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import psycopg

log = logging.getLogger("signalbox.api.notify")

CHANNEL = "signalbox_signal"
# A trigger on `messages` notifies each recorded message's id (migration 0021):
# the inbox's live events (`app/web/inbox_feed.py`).
MESSAGE_CHANNEL = "signalbox_message"


class Wake:
    """A long poll's doorbell, rung on its event loop for each notification
    of its signal: `payload` is the latest one's, None when it was rung for
    no notification (the listener reconnected: anything may have changed)."""

    __slots__ = ("event", "payload")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.payload: str | None = None

    def ring(self, payload: str | None) -> None:
        self.payload = payload
        self.event.set()

    def take(self) -> str | None:
        """The latest payload, the doorbell made quiet again."""
        payload, self.payload = self.payload, None
        self.event.clear()
        return payload


class SignalNotifier:
    def __init__(
        self, database_url: str, on_message: Callable[[str | None], None] | None = None
    ) -> None:
        """`on_message(id)` is called (on the listener thread) for each
        recorded message, and with None after a reconnect."""
        self._url = database_url
        self._on_message = on_message
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, Wake]]] = defaultdict(set)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="signal-notifier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)

    @asynccontextmanager
    async def subscribe(self, signal_id: str) -> AsyncIterator[Wake]:
        entry = (asyncio.get_running_loop(), Wake())
        with self._lock:
            self._waiters[signal_id].add(entry)
        try:
            yield entry[1]
        finally:
            with self._lock:
                waiters = self._waiters.get(signal_id)
                if waiters is not None:
                    waiters.discard(entry)
                    if not waiters:
                        del self._waiters[signal_id]

    def _wake(self, payload: str) -> None:
        signal_id = payload.partition(" ")[0]
        with self._lock:
            entries = list(self._waiters.get(signal_id, ()))
        for loop, wake in entries:
            loop.call_soon_threadsafe(wake.ring, payload)

    def _wake_all(self) -> None:
        with self._lock:
            entries = [e for waiters in self._waiters.values() for e in waiters]
        for loop, wake in entries:
            loop.call_soon_threadsafe(wake.ring, None)

    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    if self._on_message is not None:
                        conn.execute(f"LISTEN {MESSAGE_CHANNEL}")
                    self.connected.set()
                    delay = 0.5
                    # Changes made while we were away were not notified.
                    self._wake_all()
                    if self._on_message is not None:
                        self._on_message(None)
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.channel == MESSAGE_CHANNEL and self._on_message is not None:
                                self._on_message(note.payload)
                            else:
                                self._wake(note.payload)
            except psycopg.Error:
                self.connected.clear()
                log.warning(
                    "notification listener lost its connection; reconnecting",
                    extra={"event": "notify_reconnect"},
                )
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
