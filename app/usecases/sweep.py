"""The periodic sweep: the database is the truth, the broker a doorbell.

Each tick expires overdue signals, lapses claim leases, sends a task for
every due signal that has none (first sends, backoff steps, the final check
at the deadline, and tasks lost to a broker restart or a killed worker), and
re-publishes dead letters whose publication was lost, and refreshes the
planner statistics of a hot table that grew by its own size since they were
taken (`app.db.statistics`: a fresh database is otherwise planned as empty
for its first minute). Every step is its own
short transaction and safe to run concurrently with another sweep (`SKIP
LOCKED`, leases).

It runs in the beat process itself (`workers.beat`), never behind checks
on a queue, so a backlog of slow checks cannot starve it; and it makes the
due checks of providers that push (the sink) itself, for the same reason:
their final check must not wait behind another provider's slow calls. A lost task is
re-sent only while no task waits in the `signals` queue: a backlog already
holds the tasks, and copies would only feed it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.db import due as due_db
from app.db import statistics
from app.db.engine import autocommit, transaction
from app.infra import dispatch, queue
from app.providers.runtime import provider_configs, pushes
from app.settings import Settings
from app.usecases import checks, claims, expiry
from app.usecases.checks import recipient_typos

log = logging.getLogger("signalbox.sweep")


@dataclass(frozen=True)
class SweepReport:
    expired: int
    lapsed: int
    enqueued: int
    republished: int


def sweep(
    settings: Settings, limit: int = 500, *, runner: checks.CheckRunner | None = None
) -> SweepReport:
    """One tick. With `runner` (beat passes its own), the due checks of
    providers that push (the sink: a database query) are made here, so no
    backlog of slow provider calls in the workers can delay them; the
    others are sent as tasks."""
    sinks = [name for name in provider_configs(settings) if pushes(settings, name)]
    expired = expiry.expire_overdue(
        limit,
        grace_seconds=settings.deadline_grace_seconds,
        typo_look=recipient_typos.record_typo_near_misses,
        sink_providers=sinks,
    )
    lapsed = claims.lapse_leases(limit)
    waiting_tasks = dispatch.queue_depth(queue.SIGNALS_QUEUE)
    checked_here = sinks if runner is not None else []
    with transaction() as session:
        due = due_db.signal_mark_due_enqueued(
            session,
            requeue_after_seconds=settings.requeue_after_seconds,
            resend_lost=not waiting_tasks,
            limit=limit,
            looked_here=checked_here,
        )
    # One check takes every due signal of its provider (up to a batch), so
    # one task (or check in process) per provider and batch is enough: the others ride along.
    per_provider: dict[str, int] = {}
    for signal_id, reason, provider in due:
        if reason == "sweep":
            log.info(
                "re-sending a lost check task",
                extra={"event": "check_requeued", "signal_id": signal_id},
            )
        seen = per_provider.get(provider, 0)
        per_provider[provider] = seen + 1
        if seen % checks.BATCH_LIMIT != 0:
            continue
        if runner is None or provider not in checked_here:
            dispatch.enqueue_check(signal_id)
            continue
        # A check that fails here sends its task; stamped, it is also made
        # again after requeue_after_seconds if that task is lost.
        runner.check(checks.CheckRequest(signal_id, checks.Why.SWEEP, provider))
    republished = expiry.republish_unsent() + expiry.resend_unalerted()
    with autocommit() as session:
        analyzed = statistics.analyze_grown(session)
    if analyzed:
        log.info(
            "planner statistics refreshed for tables grown since their last",
            extra={"event": "statistics_refreshed", "tables": analyzed},
        )
    return SweepReport(expired=expired, lapsed=lapsed, enqueued=len(due), republished=republished)
