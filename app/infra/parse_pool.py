"""Parse received mail in worker processes, so no message can stall the sink
(or the API, whose first looks at sink signals parse what they match).

The sink's event loop never parses: a hostile message (huge folded headers,
tens of thousands of MIME parts) would hold it, and with it every other SMTP
session. ``parse_mail`` runs instead in a small pool of spawned processes.
There it runs in the process's main thread, so its CPU-time budget
(``app/infra/parse_budget.py``, ``signal.setitimer``) interrupts a slow parse.
The sink also stops waiting after ``HARD_TIMEOUT_SECONDS`` of wall time (a
parse stuck inside C code) and replaces the pool, so a stuck process cannot
hold a slot.

The pool's processes are started (``warm``) before any parse is timed: on a
loaded machine starting Python takes seconds, and that is not the parse's fault.
At most ``workers`` parses run at once; others wait their turn without holding
anything of the event loop.

A thread that may wait (``parse_blocking``: the sink's and the API's looks)
parses a message of at most ``INLINE_PARSE_BYTES`` itself. At that size the
bounds of ``app.domain.mail`` keep any parse to a few milliseconds, so the
CPU budget has nothing to cut, and the round trip to a pool process (pickling
both ways, two process wake-ups: 0.4 to 0.9 ms of a look, as measured) is saved.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from app.domain.mail import PARSE_TIME_BUDGET_SECONDS, ParsedMail, parse_mail, report_bounds
from app.infra.parse_budget import parse_on_budget

log = logging.getLogger("signalbox.sink")

HARD_TIMEOUT_SECONDS = 60.0

# Messages up to this size are parsed by `parse_blocking`'s own thread. The
# slowest shape measured within it (16 KiB of MIME parts, each with headers of
# distinct parameters) takes about 23 ms of CPU; the budget is 3 s. A typical
# verification mail is a few KiB.
INLINE_PARSE_BYTES = 16 * 1024


def _ready() -> bool:
    return True


def _ignore_interrupts() -> None:
    """In each parse process: Ctrl-C is the sink's to handle. It closes the
    pool, and the process ends then, instead of printing a KeyboardInterrupt
    traceback from wherever it waited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ParsePool:
    def __init__(
        self,
        workers: int = 2,
        budget_seconds: float = PARSE_TIME_BUDGET_SECONDS,
        hard_timeout_seconds: float = HARD_TIMEOUT_SECONDS,
    ) -> None:
        self.workers = max(1, workers)
        self.budget = budget_seconds
        self.hard_timeout = hard_timeout_seconds
        self._executor: ProcessPoolExecutor | None = None
        self._warmed: ProcessPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        self._warming: asyncio.Lock | None = None
        # Parses in flight (both kinds), for `close`.
        self._count = threading.Lock()
        self._in_flight = 0

    async def warm(self) -> ProcessPoolExecutor:
        """The pool, with all its processes started."""
        if self._warming is None:
            self._warming = asyncio.Lock()
        async with self._warming:
            executor = self._pool()
            if self._warmed is not executor:
                loop = asyncio.get_running_loop()
                # One call per process: the executor starts a process for each
                # call that finds none idle.
                await asyncio.gather(
                    *(loop.run_in_executor(executor, _ready) for _ in range(self.workers))
                )
                self._warmed = executor
            return executor

    async def parse(self, raw: bytes) -> ParsedMail | None:
        """The parsed message, or None when it could not be parsed (the message
        then keeps the recipients it was stored with)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.workers)
        async with self._slots:
            try:
                executor = await self.warm()
            except BrokenProcessPool:
                self._discard(self._executor)
                return None
            job = functools.partial(parse_on_budget, raw, time_budget=self.budget)
            with self._count:
                self._in_flight += 1
            try:
                future = asyncio.get_running_loop().run_in_executor(executor, job)
                mail = await asyncio.wait_for(future, self.hard_timeout)
            except TimeoutError:
                log.warning(
                    "a message took too long to parse; its pool is replaced",
                    extra={"event": "sink_parse_timeout", "size": len(raw)},
                )
                self._discard(executor)
                return None
            except BrokenProcessPool:
                self._discard(executor)
                return None
            finally:
                with self._count:
                    self._in_flight -= 1
        # The parse happened in another process: count its bounds here.
        report_bounds(mail.defects)
        return mail

    def parse_blocking(self, raw: bytes) -> ParsedMail:
        """``parse_mail`` for a thread that may wait: the sink's own looks,
        which parse the messages they match. A message of at most
        ``INLINE_PARSE_BYTES`` is parsed in this thread (its bounds keep it
        short); a larger one in the pool, since in a thread of the sink the
        parse's CPU budget could not apply. Raises (TimeoutError,
        BrokenProcessPool) when the pool could not parse it: the look fails
        and is made again."""
        if len(raw) <= INLINE_PARSE_BYTES:
            return parse_mail(raw)  # no timer in a thread; counts its bounds itself
        executor = self._pool()
        future = executor.submit(parse_on_budget, raw, time_budget=self.budget)
        with self._count:
            self._in_flight += 1
        try:
            mail = future.result(timeout=self.hard_timeout)
        except TimeoutError:
            log.warning(
                "a message took too long to parse; its pool is replaced",
                extra={"event": "sink_parse_timeout", "size": len(raw)},
            )
            self._discard(executor)
            raise
        except BrokenProcessPool:
            self._discard(executor)
            raise
        finally:
            with self._count:
                self._in_flight -= 1
        report_bounds(mail.defects)
        return mail

    def close(self, *, wait_if_idle: bool = False) -> None:
        """Shut the pool down. With `wait_if_idle`, and no parse in flight, wait
        for its processes and management thread to end: an interpreter that
        exits while that thread is still closing its pipe prints a traceback
        from concurrent.futures' exit hook (a race in CPython 3.11). A parse in
        flight is never waited for (it may be stuck in C code)."""
        if self._executor is not None:
            wait = wait_if_idle and self._in_flight == 0
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn, not fork: the sink runs threads (its event loop, the
            # store executor), and forking a threaded process is unsafe.
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_ignore_interrupts,
            )
        return self._executor

    def _discard(self, executor: ProcessPoolExecutor | None) -> None:
        if executor is None:
            return
        if self._executor is executor:
            self._executor = None
        # Terminate its processes: one of them may be stuck in a parse that
        # no timer could interrupt. (The executor has no public way to do it
        # before Python 3.14's terminate_workers.)
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
