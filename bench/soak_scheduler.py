"""The soak's clock: callables run at wall-clock instants on a thread pool."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Scheduler:
    """Runs callables at wall-clock instants on a thread pool; knows when it is idle."""

    def __init__(self, threads: int) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._pending = 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="soak")
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        self.errors: list[str] = []

    def at(self, when: float, fn: Callable[[], None]) -> None:
        with self._cond:
            self._pending += 1
            heapq.heappush(self._heap, (when, next(self._seq), fn))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._heap or self._heap[0][0] > time.time()):
                    timeout = (self._heap[0][0] - time.time()) if self._heap else None
                    self._cond.wait(timeout if timeout is None else max(0.0, min(timeout, 0.5)))
                if self._stop:
                    return
                _, _, fn = heapq.heappop(self._heap)
            self._pool.submit(self._run, fn)

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # the record says what failed; the soak goes on
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        end = time.time() + timeout
        with self._cond:
            while self._pending and time.time() < end:
                self._cond.wait(0.5)
            return self._pending == 0

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
