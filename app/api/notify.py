"""Wake long polls when a signal changes: PostgreSQL LISTEN/NOTIFY.

A trigger on `signals` notifies `signalbox_signal` with the signal id when the
signal stops waiting (found or expired), whichever process made the change:
a long poll waits only on a waiting signal (migration 0007). One listener
thread per API process fans the notifications out to the waiting requests'
asyncio events.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

log = logging.getLogger("signalbox.api.notify")

CHANNEL = "signalbox_signal"


class SignalNotifier:
    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = (
            defaultdict(set)
        )
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
    async def subscribe(self, signal_id: str) -> AsyncIterator[asyncio.Event]:
        entry = (asyncio.get_running_loop(), asyncio.Event())
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

    def _wake(self, signal_id: str) -> None:
        with self._lock:
            entries = list(self._waiters.get(signal_id, ()))
        for loop, event in entries:
            loop.call_soon_threadsafe(event.set)

    def _wake_all(self) -> None:
        with self._lock:
            entries = [e for waiters in self._waiters.values() for e in waiters]
        for loop, event in entries:
            loop.call_soon_threadsafe(event.set)

    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    delay = 0.5
                    # Changes made while we were away were not notified.
                    self._wake_all()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self._wake(note.payload)
            except psycopg.Error:
                self.connected.clear()
                log.warning(
                    "notification listener lost its connection; reconnecting",
                    extra={"event": "notify_reconnect"},
                )
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
