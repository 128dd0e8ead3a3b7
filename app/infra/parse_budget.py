"""The parse's CPU budget: a virtual timer that interrupts a parse with
:class:`~app.domain.mail.bounds.ParseTimeout`, and ``parse_on_budget``, the
parse of ``app.domain.mail`` under it.

The parser is pure and arms nothing; whoever runs it where a timer can
interrupt it (a process's main thread: a Celery prefork child, a parse pool
process) passes the budget in. See ``app.domain.mail`` for why the budget
exists and where it applies.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from types import FrameType

from app.domain.mail import PARSE_TIME_BUDGET_SECONDS, ParsedMail, parse_mail
from app.domain.mail.bounds import ParseTimeout

__all__ = ["RETRY_SECONDS", "ParseTimeout", "cpu_budget", "parse_on_budget"]

# The budget counts CPU time this process spends (ITIMER_VIRTUAL), not wall
# time: on a loaded machine a parse waits for a core without being any more
# hostile, and a legitimate message must not lose its body for that.
_TIMER = getattr(signal, "ITIMER_VIRTUAL", None)
_TIMER_SIGNAL = getattr(signal, "SIGVTALRM", None)

# Python swallows an exception raised where it cannot propagate (a gc
# callback, a ``__del__``, a weakref callback: it goes to
# ``sys.unraisablehook``). Before each raise the handler therefore arms the
# timer again for this much CPU time: a swallowed timeout fires again, in the
# parser, until one propagates. The cyclic collector, which runs most such
# callbacks, is paused for the budgeted body (see ``_CpuBudget``).
RETRY_SECONDS = 0.005


class _CpuBudget:
    """The timer of :func:`cpu_budget`. Its handler never raises inside
    ``__enter__`` or ``__exit__``: there a raise would leave the timer armed
    and the handler installed for whatever code runs next.

    The cyclic garbage collector is paused for the body: a collection runs
    weakref callbacks, ``__del__`` methods and ``gc.callbacks`` of unrelated
    objects, where the timer's raise would be swallowed (and reported on
    stderr) rather than end the parse. The body's allocations are bounded by
    the message bounds, and whatever cycles it leaves are collected after."""

    __slots__ = (
        "_active",
        "_gc_was_enabled",
        "_outer_delay",
        "_outer_interval",
        "_previous",
        "_seconds",
        "_started",
    )

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._active = False
        self._gc_was_enabled = False
        self._outer_delay = 0.0
        self._outer_interval = 0.0
        self._previous: object = None
        self._started = 0.0

    def __enter__(self) -> None:
        seconds = self._seconds
        if (
            seconds is None
            or seconds <= 0
            or _TIMER is None
            or _TIMER_SIGNAL is None
            or threading.current_thread() is not threading.main_thread()
        ):
            return
        outer_delay, outer_interval = signal.getitimer(_TIMER)
        if outer_delay and outer_delay <= seconds:
            return  # the outer timer fires first: it is the tighter budget
        try:
            self._previous = signal.signal(_TIMER_SIGNAL, self._on_timer)
        except ValueError:  # not the main interpreter
            return
        self._outer_delay, self._outer_interval = outer_delay, outer_interval
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        self._started = time.process_time()
        self._active = True
        signal.setitimer(_TIMER, seconds)

    def _on_timer(self, signum: int, frame: FrameType | None) -> None:
        if not self._active or _TIMER is None:
            return
        code = frame.f_code if frame is not None else None
        if code is _EXIT_CODE:
            return  # being disarmed
        signal.setitimer(_TIMER, RETRY_SECONDS)
        if code is _ENTER_CODE:
            return  # the body has not begun: the retry fires in it
        raise ParseTimeout

    def __exit__(self, *exc_info: object) -> None:
        if not self._active or _TIMER is None or _TIMER_SIGNAL is None:
            return
        signal.setitimer(_TIMER, 0)
        self._active = False
        signal.signal(_TIMER_SIGNAL, self._previous)  # type: ignore[arg-type]
        if self._gc_was_enabled:
            gc.enable()
        if self._outer_delay:
            left = max(self._outer_delay - (time.process_time() - self._started), 0.001)
            signal.setitimer(_TIMER, left, self._outer_interval)


_ENTER_CODE = _CpuBudget.__enter__.__code__
_EXIT_CODE = _CpuBudget.__exit__.__code__


def cpu_budget(seconds: float | None) -> _CpuBudget:
    """Interrupt the body with :class:`ParseTimeout` after ``seconds`` of CPU
    time when this is a main thread whose virtual timer is free or set to fire
    later; else do nothing. The timer and handler are restored on exit."""
    return _CpuBudget(seconds)


def parse_on_budget(
    raw: bytes, *, time_budget: float | None = PARSE_TIME_BUDGET_SECONDS
) -> ParsedMail:
    """``parse_mail`` interrupted after ``time_budget`` seconds of CPU time
    (:func:`cpu_budget`: where a timer can interrupt it; ``None`` for no
    timer): then the headers read by a linear fallback and ``BoundExceeded:time``."""
    return parse_mail(raw, budget=cpu_budget(time_budget))
