"""Running a check: take the due signals of a provider, ask it, write the
result; and the same check made in this process rather than by a worker."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app.db import takes as takes_db
from app.db.engine import autocommit
from app.db.rows import Row
from app.domain.ids import new_id
from app.infra import dispatch
from app.settings import Settings
from app.usecases.checks.call import ask_in_bulkhead, bulkhead_of, provider_or_error
from app.usecases.checks.criteria import search_query
from app.usecases.checks.decide import CheckBatch, write_answer
from app.usecases.checks.heartbeat import LeaseKeeper
from app.usecases.checks.observed import prepare_messages
from app.usecases.expiry import publish

log = logging.getLogger("signalbox.checks")

BATCH_LIMIT = 200

# The backoff's jitter: one generator per process, not one seeded from the
# system's entropy for every check; seeded again in a forked child (a worker's
# pool), so the children do not draw the same jitter.
_JITTER = random.Random()
os.register_at_fork(after_in_child=_JITTER.seed)


@dataclass
class CheckReport:
    provider: str | None = None
    signals: int = 0
    outcome: str | None = None
    found: list[str] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)
    # Pushed while their check ran: checked again at once.
    pushed: list[str] = field(default_factory=list)


def run_check(
    settings: Settings,
    signal_id: str,
    *,
    provider_for: Any,
    breaker_for: Any,
    rng: random.Random | None = None,
    resend_pushed: bool = True,
    bulkhead_for: Any = None,
    taken: Sequence[Row] | None = None,
) -> CheckReport:
    """Check `signal_id` and the other due signals of its provider (`taken`:
    the rows a push's statement took for this check already, see
    `takes_db.signal_push_and_lock`; the check then takes none itself).

    `provider_for(name) -> Provider` and `breaker_for(name) -> Breaker` are
    injected by the front door (the Celery task, or `check_in_process`'s caller).
    Signals pushed while the check ran are sent a task unless
    `resend_pushed` is False (the caller reads `report.pushed` itself).
    `bulkhead_for(name) -> Bulkhead` (a worker's, see app/providers/bulkhead.py)
    bounds how many of this worker's processes call a polled provider at
    once; a check refused a slot is `circuit_open` / `provider_busy`.
    """
    report = CheckReport()
    if taken is None:
        # One statement (lock, fence and lease the batch), committed alone: no
        # BEGIN and COMMIT round trips around it.
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
        provider, answer = provider_or_error(provider_for, provider_name)
        precision = getattr(provider, "timestamp_precision", timedelta(0))
        pushes = bool(getattr(provider, "pushes", False))
        if provider is not None:
            # A final check (at or after a deadline) is the one expiry waits
            # for: an open breaker does not skip it.
            final = any(r["looked_at"] >= r["expires_at"] for r in taken)
            # A polled provider's call holds this process as long as it takes:
            # the bulkhead keeps a slow one from holding every process.
            bulkhead = None if pushes else bulkhead_of(bulkhead_for, provider_name)
            query = search_query(taken, precision)
            answer = ask_in_bulkhead(bulkhead, keeper, provider, breaker_for, query, final=final)
            # Parsed here, with no lock held: the write below finds them parsed.
            _prepare(provider_name, answer.messages)
    report.outcome = answer.outcome.value
    batch = CheckBatch(
        settings=settings,
        taken=taken,
        answer=answer,
        precision=precision,
        pushes=pushes,
        started_at=taken[0]["looked_at"],
        batch_id=new_id("chk"),
        rng=rng or _JITTER,
        started_monotonic=taken_monotonic,
    )
    effects = write_answer(batch, signal_id)
    effects.emit()
    report.dead_letters.extend(effects.dead_letters)
    report.pushed.extend(effects.pushed)
    publish(report.dead_letters)
    if resend_pushed:
        for pushed_id in report.pushed:
            dispatch.enqueue_check(pushed_id)
    return report


class InProcessCheck:
    """Makes the check of a signal's provider batch in this process
    (`check_in_process`) with the given providers and breakers: what the
    sink, beat and the API pass to the push, the sweep and the first look.
    `push_and_lock` is the push's statement with this check's lock sent
    along (`takes_db.signal_push_and_lock`)."""

    def __init__(self, settings: Settings, *, provider_for: Any, breaker_for: Any) -> None:
        self.settings = settings
        self.provider_for = provider_for
        self.breaker_for = breaker_for

    def __call__(self, signal_id: str, *, taken: Sequence[Row] | None = None) -> CheckReport:
        return check_in_process(
            self.settings,
            signal_id,
            provider_for=self.provider_for,
            breaker_for=self.breaker_for,
            taken=taken,
        )

    def push_and_lock(
        self, session: Connection, provider: str, recipients: Sequence[str], *, limit: int
    ) -> tuple[list[tuple[str, datetime]], list[Row]]:
        """Push `recipients`' waiting signals of `provider` (the first
        `limit`) and take them for this check, in one round trip: (pushed,
        taken), taken to be passed to `self(..., taken=taken)`."""
        return takes_db.signal_push_and_lock(
            session,
            provider,
            recipients,
            limit=limit,
            lease_seconds=self.settings.check_lease_seconds,
            batch_limit=BATCH_LIMIT,
            coalesce_seconds=self.settings.coalesce_window_seconds,
        )


def _prepare(provider_name: str, messages: Sequence[Any]) -> None:
    """`prepare_messages`; a failure only leaves the parsing to the write."""
    if not messages:
        return
    try:
        prepare_messages(provider_name, messages)
    except Exception as exc:
        log.info(
            "messages not parsed before the write; it parses them",
            extra={"event": "prepare_failed", "provider": provider_name,
                   "error": type(exc).__name__},
        )  # fmt: skip


def in_process_check_for(settings: Settings) -> InProcessCheck:
    """`check_in_process` with this process's providers and breakers."""
    from app.providers.breaker import breaker_for
    from app.providers.runtime import provider_for

    return InProcessCheck(settings, provider_for=provider_for, breaker_for=breaker_for)


# How many times `check_in_process` checks again the signals pushed while it
# checked, before it leaves them to a task.
IN_PROCESS_ROUNDS = 3


def check_in_process(
    settings: Settings,
    signal_id: str,
    *,
    provider_for: Any,
    breaker_for: Any,
    taken: Sequence[Row] | None = None,
) -> CheckReport:
    """Make the check of `signal_id` (and its provider's other due signals)
    in this process, not through a worker.

    For a provider that pushes (the sink), whose search is a database query,
    the sink makes it where the push is made and beat where the sweep finds
    it due. So a backlog of slow provider calls holding every worker
    process, or a worker killed with the task it reserved, cannot keep the
    check from being made before the deadline. The check is the same use
    case, with the same lease, fence and history, as a worker's.
    """
    report = run_check(
        settings,
        signal_id,
        provider_for=provider_for,
        breaker_for=breaker_for,
        resend_pushed=False,
        taken=taken,
    )
    pending = list(report.pushed)
    for _ in range(IN_PROCESS_ROUNDS - 1):
        if not pending:
            break
        again: list[str] = []
        for pushed_id in pending:
            more = run_check(
                settings,
                pushed_id,
                provider_for=provider_for,
                breaker_for=breaker_for,
                resend_pushed=False,
            )
            report.found.extend(more.found)
            report.dead_letters.extend(more.dead_letters)
            again.extend(more.pushed)
        pending = again
    for pushed_id in pending:
        dispatch.enqueue_check(pushed_id)
    return report


def try_check_in_process(
    check_here: InProcessCheck,
    signal_id: str,
    provider: str,
    *,
    event: str,
    message: str,
    taken: Sequence[Row] | None = None,
) -> CheckReport | None:
    """Make `check_here(signal_id, taken=taken)` and return its report; a
    failure is logged (with `event`), not raised, and gives None: the check's
    signals stay due and the sweep checks them again."""
    try:
        return check_here(signal_id) if taken is None else check_here(signal_id, taken=taken)
    except Exception as exc:
        log.warning(
            message,
            extra={
                "event": event,
                "signal_id": signal_id,
                "provider": provider,
                "error": type(exc).__name__,
            },
        )
        return None
