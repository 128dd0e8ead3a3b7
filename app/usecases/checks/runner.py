"""The check runner: one object runs every check, whoever asks for it.

The Celery task, the sink's push, the sweep and the API's first look all
build (or get) a `CheckRunner` and call `runner.check(CheckRequest(...))`.
Its dependencies are Protocols (`app.usecases.checks.ports`): the provider
lookup, the breaker lookup, a worker's bulkheads, the parser and the task
sender. One failure policy: a check that cannot be made in this process
sends its task (the worker makes it; the sweep still finds what is due if
that send is lost too).

A check of one batch: transaction 1 takes the due signals of the provider
(one statement, or the rows the push's statement took), the provider is
asked with no lock held (`call`), and transaction 2 (`decide`) writes.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection

from app.db import takes as takes_db
from app.db.create_look import FirstLook
from app.db.engine import autocommit
from app.domain.ids import new_id
from app.infra.parse_budget import parse_on_budget
from app.settings import Settings
from app.usecases.checks.call import ask_in_bulkhead, bulkhead_of, provider_or_error
from app.usecases.checks.criteria import search_query
from app.usecases.checks.decide import CheckBatch, write_answer
from app.usecases.checks.first import (
    FirstLooks,
    after_presumed_look,
    first_look_if_empty,
    presumed_first_look,
    presumed_look_made,
)
from app.usecases.checks.heartbeat import LeaseKeeper
from app.usecases.checks.observed import prepare_messages
from app.usecases.checks.ports import (
    BATCH_LIMIT,
    BreakerLookup,
    BulkheadLookup,
    CheckReport,
    CheckRequest,
    DispatchTasks,
    Parser,
    ProviderLookup,
    TaskSender,
    Why,
)
from app.usecases.expiry import publish

log = logging.getLogger("signalbox.checks")

# The backoff's jitter: one generator per process, not one seeded from the
# system's entropy for every check; seeded again in a forked child (a worker's
# pool), so the children do not draw the same jitter.
_JITTER = random.Random()
os.register_at_fork(after_in_child=_JITTER.seed)

# How many times a check made in this process checks again the signals
# pushed while it checked, before it leaves them to a task.
IN_PROCESS_ROUNDS = 3

# A check made in this process that failed: (event, message) of its log line.
_FAILED = {
    Why.PUSH: ("push_look_failed", "pushed look failed; its task is sent"),
    Why.SWEEP: ("sweep_look_failed", "sweep's look failed; its task is sent"),
    Why.FIRST_LOOK: ("first_look_failed", "first look failed in this process; its task is sent"),
}


@dataclass(frozen=True)
class _Deps:
    providers: ProviderLookup
    breakers: BreakerLookup
    bulkheads: BulkheadLookup | None
    parse: Parser


def _quick_failed(
    level: int, message: str, signal_id: str | None, provider: str | None, exc: Exception
) -> None:
    """The line of a first look in one statement that could not be made or
    followed (event `quick_first_look_failed`): ids and the error's type only."""
    log.log(
        level,
        message,
        extra={
            "event": "quick_first_look_failed",
            "signal_id": signal_id,
            "provider": provider,
            "error": type(exc).__name__,
        },
    )


class CheckRunner:
    """Runs checks with its dependencies; `check(request)` is the one entry point."""

    def __init__(
        self,
        settings: Settings,
        *,
        providers: ProviderLookup,
        breakers: BreakerLookup,
        bulkheads: BulkheadLookup | None = None,
        parse: Parser = parse_on_budget,
        tasks: TaskSender | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.deps = _Deps(providers, breakers, bulkheads, parse)
        self.tasks: TaskSender = tasks or DispatchTasks(settings)
        self.rng = rng or _JITTER
        self.first_looks = FirstLooks()

    @property
    def parse(self) -> Parser:
        return self.deps.parse

    def check(self, request: CheckRequest) -> CheckReport | None:
        """Make the check `request` asks for. A task's check raises what it
        raised (the task is the last resort); any other check that fails is
        logged, its task sent, and gives None."""
        if request.why is Why.TASK:
            return self._task(request.signal_id)
        if request.why is Why.FIRST_LOOK:
            return self._first_look(request)
        return self._here(request, request.signal_id, request.taken)

    def _task(self, batch_key: str) -> CheckReport:
        # Before the batch is taken: a create refused the ticket meanwhile is
        # committed, so this check takes it.
        self.tasks.first_look_started(batch_key)
        report = self._batch(batch_key, bulkheads=self.deps.bulkheads)
        for pushed_id in report.pushed:
            self.tasks.check(pushed_id)
        if report.signals >= BATCH_LIMIT:
            # A full batch: more may be due (a burst of creates shared one task).
            self.tasks.check(batch_key)
        return report

    def _here(
        self, request: CheckRequest, signal_id: str, taken: Sequence[Any] | None = None
    ) -> CheckReport | None:
        """The check of `signal_id` made in this process (and up to
        IN_PROCESS_ROUNDS of the signals pushed while it ran); failed: its task."""
        try:
            report = self._batch(signal_id, taken=taken)
            pending = list(report.pushed)
            for _ in range(IN_PROCESS_ROUNDS - 1):
                again: list[str] = []
                for pushed_id in pending:
                    more = self._batch(pushed_id)
                    report.found.extend(more.found)
                    report.dead_letters.extend(more.dead_letters)
                    again.extend(more.pushed)
                pending = again
        except Exception as exc:
            event, message = _FAILED[request.why]
            log.warning(
                message,
                extra={
                    "event": event,
                    "signal_id": signal_id,
                    "provider": request.provider,
                    "error": type(exc).__name__,
                },
            )
            self._send(request, signal_id)
            return None
        for pushed_id in pending:
            self.tasks.check(pushed_id)
        return report

    def _send(self, request: CheckRequest, signal_id: str) -> None:
        if request.why is Why.FIRST_LOOK:
            self.tasks.first_look(request.provider, signal_id)
        else:
            self.tasks.check(signal_id)

    def _first_look(self, request: CheckRequest) -> CheckReport | None:
        """A new signal's first look, made here after its create's commit:
        in one statement when the sink holds no mail for it, else the whole
        check, one per provider at a time (creates meanwhile ride in its
        next round: `FirstLooks`)."""
        if request.created is not None and self._quick(request):
            return None
        provider, signal_id = request.provider, request.signal_id
        if self.first_looks.join(provider, signal_id):
            return None
        report = None
        try:
            while True:
                report = self._here(request, signal_id)
                # A full batch left due signals behind: one more round takes them.
                if report is not None and report.signals >= BATCH_LIMIT:
                    continue
                again = self.first_looks.done(provider)
                if again is None:
                    return report
                signal_id = again
        except BaseException:  # interrupted: the next create looks (the sweep meanwhile)
            self.first_looks.abandon(provider)
            raise

    def presumed_look(self, values: Mapping[str, Any]) -> FirstLook | None:
        """The first look a new sink signal's create can make in its own
        statement, for the `values` it inserts (`presumed_first_look`); None
        when the whole look must make it, or when the breaker could not be
        read (logged; the whole look follows)."""
        try:
            return presumed_first_look(
                self.settings,
                values,
                provider_for=self.deps.providers,
                breaker_for=self.deps.breakers,
            )
        except Exception as exc:
            _quick_failed(
                logging.INFO,
                "the create's first look was not tried; the whole look follows",
                values.get("id"),
                values.get("provider"),
                exc,
            )
            return None

    def after_created(
        self, request: CheckRequest, session: Connection, seconds: float
    ) -> CheckRequest | None:
        """What a new signal's first look still needs once its create
        committed on `session` (the create's statement took `seconds`): None
        when the create made it and the sink holds no mail stored since;
        else the whole look, for the caller to make once its answer is sent."""
        assert request.created is not None
        if not presumed_look_made(request.created):
            return replace(request, created=None)
        try:
            if not after_presumed_look(request.created, session, seconds):
                return None
        except Exception as exc:
            # The signal is created and looked at: its answer stands. Mail
            # stored in the instant this read covers is then found by the
            # deadline's look (or a later push), not now.
            _quick_failed(
                logging.WARNING,
                "the read after a create that looked failed; its answer stands",
                request.signal_id,
                request.provider,
                exc,
            )
            return None
        return replace(request, why=Why.PUSH, created=None)

    def quick_look(self, created: Mapping[str, Any], session: Connection | None = None) -> bool:
        """The one-statement first look of the new signal `created` (its row
        as the create returned it), on `session` when given: True when made;
        raises what the database or the breaker raised (nothing is written
        then either)."""
        return first_look_if_empty(
            self.settings,
            created,
            provider_for=self.deps.providers,
            breaker_for=self.deps.breakers,
            session=session,
        )

    def _quick(self, request: CheckRequest, session: Connection | None = None) -> bool:
        """`quick_look`; a failure is logged and taken as "not made" (it
        wrote nothing): the whole look follows."""
        assert request.created is not None
        try:
            return self.quick_look(request.created, session)
        except Exception as exc:
            _quick_failed(
                logging.INFO,
                "one-statement first look failed; the whole look follows",
                request.signal_id,
                request.provider,
                exc,
            )
            return False

    def _batch(
        self,
        signal_id: str,
        *,
        taken: Sequence[Any] | None = None,
        bulkheads: BulkheadLookup | None = None,
    ) -> CheckReport:
        """Check `signal_id` and the other due signals of its provider
        (`taken`: the rows a push's statement took for this check already,
        see `takes_db.signal_push_and_lock`; the check then takes none).
        Sends no task: the signals pushed meanwhile are in `report.pushed`.
        `bulkheads` (a worker's) bound how many of its processes call a
        polled provider at once; a check refused a slot is `circuit_open` /
        `provider_busy`."""
        settings, deps = self.settings, self.deps
        report = CheckReport()
        if taken is None:
            # One statement (lock, fence and lease the batch), committed alone.
            with autocommit() as session:
                taken = takes_db.signal_lock_for_check(
                    session,
                    signal_id,
                    lease_seconds=settings.check_lease_seconds,
                    batch_limit=BATCH_LIMIT,
                    coalesce_seconds=settings.coalesce_window_seconds,
                )
        taken_monotonic = time.monotonic()
        if not taken:
            return report
        provider_name = taken[0]["provider"]
        report.provider, report.signals = provider_name, len(taken)
        fences = [(r["id"], r["check_fence"]) for r in taken]
        with LeaseKeeper(fences, settings.check_lease_seconds) as keeper:
            provider, answer = provider_or_error(deps.providers, provider_name)
            precision = getattr(provider, "timestamp_precision", timedelta(0))
            pushes = bool(getattr(provider, "pushes", False))
            if provider is not None:
                # A final check (at or after a deadline) is the one expiry
                # waits for: an open breaker does not skip it.
                final = any(r["looked_at"] >= r["expires_at"] for r in taken)
                # A polled provider's call holds this process as long as it
                # takes: the bulkhead keeps a slow one from holding every process.
                bulkhead = None if pushes else bulkhead_of(bulkheads, provider_name)
                query = search_query(taken, precision)
                answer = ask_in_bulkhead(
                    bulkhead, keeper, provider, deps.breakers, query, final=final
                )
                # Parsed here, with no lock held: the write below finds them parsed.
                self._prepare(provider_name, answer.messages)
        report.outcome = answer.outcome.value
        batch = CheckBatch(
            settings=settings,
            taken=taken,
            answer=answer,
            precision=precision,
            pushes=pushes,
            started_at=taken[0]["looked_at"],
            batch_id=new_id("chk"),
            rng=self.rng,
            started_monotonic=taken_monotonic,
            parse=deps.parse,
        )
        effects = write_answer(batch, signal_id)
        effects.emit()
        report.dead_letters.extend(effects.dead_letters)
        report.pushed.extend(effects.pushed)
        publish(report.dead_letters)
        return report

    def _prepare(self, provider_name: str, messages: Sequence[Any]) -> None:
        """`prepare_messages`; a failure only leaves the parsing to the write."""
        if not messages:
            return
        try:
            prepare_messages(provider_name, messages, self.deps.parse)
        except Exception as exc:
            log.info(
                "messages not parsed before the write; it parses them",
                extra={"event": "prepare_failed", "provider": provider_name,
                       "error": type(exc).__name__},
            )  # fmt: skip


def process_runner(
    settings: Settings,
    *,
    parse: Parser = parse_on_budget,
    bulkheads: BulkheadLookup | None = None,
) -> CheckRunner:
    """A runner with this process's providers and breakers (the composition
    every front door uses; the sink passes its parse pool's parse, a worker
    its bulkheads)."""
    from app.providers.breaker import breaker_for
    from app.providers.runtime import provider_for

    return CheckRunner(
        settings,
        providers=provider_for,
        breakers=breaker_for,
        bulkheads=bulkheads,
        parse=parse,
    )
