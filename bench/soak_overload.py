"""The overload fault: more signals than the workers can look after, for a while.

First it finds the rate the stack sustains beside the rest of the soak: it
creates signals in steps of doubling rate (sink signals, each with a window
of `WINDOW` seconds and its matching mail late in the window, so each needs
several scheduled checks) and keeps the highest rate whose step kept
`signalbox_oldest_due_signal_age_seconds` below `BEHIND` seconds. Then it
creates at `factor` (1.5) x that rate for `seconds`, samples the gauge every second,
and reports its peak and the time to drain: from the end of the overload to
the gauge back under `BEHIND` (the invariants then check every overload signal).

Each signal goes through the soak's own create and delivery, so the
invariants cover them like any other: nothing lost, nothing duplicated.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.soak_plan import PlannedMail, PlannedSignal

if TYPE_CHECKING:
    from bench.soak import Soak

WINDOW = 20
BEHIND = 3.0  # seconds a due check may wait before the stack counts as behind
GAUGE = "signalbox_oldest_due_signal_age_seconds"


@dataclass
class Overload:
    soak: Soak
    step_seconds: float = 10.0
    max_steps: int = 6
    start_rate: float = 2.0
    factor: float = 1.5
    created: list[str] = field(default_factory=list)
    _seq: int = 0

    def oldest_due(self) -> float | None:
        try:
            text = self.soak.http.get("/metrics", timeout=5).text
        except httpx.HTTPError:
            return None
        for family in text_string_to_metric_families(text):
            if family.name == GAUGE:
                return max((s.value for s in family.samples), default=0.0)
        return None

    def _signal(self, tag: str) -> PlannedSignal:
        self._seq += 1
        key = f"o{self._seq:05d}"
        signal = PlannedSignal(
            key=key,
            namespace="alpha",
            run_id=f"overload-{tag}",
            test_case=f"case-{key}",
            provider="sink",
            recipient=f"overload-{key}@soak.test",
            subject_contains=f"code {key}",
            require_run_marker=False,
            window=WINDOW,
            max_checks=60,
            create_at=0.0,
            fate="mid",
            group="private",
        )
        # Seven digits: the plan's own mail ids have six (the invariants read
        # the id back from the subject).
        mail_id = f"m8{self._seq:06d}"
        signal.mails.append(
            PlannedMail(
                mail_id,
                "sink",
                signal.recipient,
                f"code {key} #{mail_id}",
                None,
                "match",
                key,
                after_created=WINDOW * 0.6,
            )
        )
        self.created.append(key)
        return signal

    def _run_at(self, rate: float, seconds: float, tag: str, stop: Callable[[], bool]) -> float:
        """Create at `rate` per second for `seconds`; the gauge's peak meanwhile."""
        start = time.time()
        count = max(1, int(rate * seconds))
        for i in range(count):
            planned = self._signal(tag)
            self.soak.scheduler.at(
                start + i / rate, functools.partial(self.soak._post_signal, planned)
            )
        peak = 0.0
        while time.time() < start + seconds and not stop():
            seen = self.oldest_due()
            peak = max(peak, seen or 0.0)
            time.sleep(1.0)
        return peak

    def run(self, seconds: float, stop: Callable[[], bool]) -> dict[str, Any]:
        # Start from a settled stack: a fault just before may have left a backlog.
        self._drain(stop, limit=30.0)
        rate, sustained = self.start_rate, 0.0
        steps: list[tuple[float, float]] = []
        for step in range(self.max_steps):
            peak = self._run_at(rate, self.step_seconds, f"calibrate{step}", stop)
            steps.append((rate, round(peak, 1)))
            if peak >= BEHIND:
                break
            sustained = rate
            rate *= 2
        # Let the calibration's backlog clear before the overload starts.
        self._drain(stop, limit=60.0)
        sustained = sustained or self.start_rate / 2
        over = sustained * self.factor
        peak = self._run_at(over, seconds, "over", stop)
        ended = time.time()
        drained = self._drain(stop, limit=300.0)
        return {
            "fault": "overload",
            "calibration": steps,
            "sustained_per_second": sustained,
            "overload_per_second": over,
            "overload_seconds": seconds,
            "oldest_due_peak": round(peak, 1),
            "time_to_drain": None if drained is None else round(drained - ended, 1),
            "signals": len(self.created),
        }

    def _drain(self, stop: Callable[[], bool], limit: float) -> float | None:
        """Until the gauge is under BEHIND; the instant it was, or None after `limit`."""
        end = time.time() + limit
        while time.time() < end and not stop():
            with contextlib.suppress(Exception):
                seen = self.oldest_due()
                if seen is not None and seen < BEHIND:
                    return time.time()
            time.sleep(1.0)
        return None
