"""The check use case: one look at a provider on behalf of its due signals.

Short locks (STYLE 3): transaction 1 takes the due signals of one provider
with `FOR UPDATE SKIP LOCKED`, stamps a check lease and a new fence, and
commits. The provider is called with no lock held. Transaction 2 records the
observed messages once each, decides every signal with the pure matcher, and
writes each result only if the signal's fence is still the one taken: a
worker that died or stalled past its lease can never write over a newer check.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import dispatch
from app.db import messages as messages_repo
from app.db import repository as repo
from app.db.engine import transaction
from app.domain.backoff import BackoffPolicy
from app.domain.ids import new_id, recipient_hash
from app.domain.mail import ParsedMail, parse_mail
from app.domain.matching import Candidate, Criteria, pick
from app.domain.scheduling import Counters, after_check
from app.domain.states import CheckOutcome, CheckReason, Status
from app.errors import ProviderError, SignalboxError
from app.expiry import expire_signal, publish
from app.observability import metrics
from app.providers.base import Provider, ProviderMessage, SearchQuery
from app.settings import Settings

log = logging.getLogger("signalbox.checks")

# How far before the earliest window a check still looks: messages that
# arrived just before the window are near misses worth reporting.
NEAR_MISS_LOOKBACK = timedelta(minutes=10)
BATCH_LIMIT = 200


class Admission(Protocol):
    @property
    def allowed(self) -> bool: ...
    @property
    def probe(self) -> bool: ...
    @property
    def retry_at(self) -> float | None: ...


class Breaker(Protocol):
    def before_call(self) -> Admission: ...
    def record_success(self) -> None: ...
    def record_failure(self, retry_after: float | None = None) -> None: ...


@dataclass
class CheckReport:
    provider: str | None = None
    signals: int = 0
    outcome: str | None = None
    found: list[str] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)
    # Pushed while their check ran: checked again at once.
    pushed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Look:
    """What the provider call produced, decided before transaction 2."""

    outcome: CheckOutcome
    messages: Sequence[ProviderMessage] = ()
    error_code: str | None = None
    retry_after: float | None = None  # seconds, from Retry-After or the breaker


def run_check(
    settings: Settings,
    signal_id: str,
    *,
    provider_for: Any,
    breaker_for: Any,
    rng: random.Random | None = None,
) -> CheckReport:
    """Check `signal_id` and the other due signals of its provider.

    `provider_for(name) -> Provider` and `breaker_for(name) -> Breaker` are
    injected by the front door (the Celery task).
    """
    rng = rng or random.Random()
    report = CheckReport()
    with transaction() as session:
        taken = repo.signal_lock_for_check(
            session,
            signal_id,
            lease_seconds=settings.check_lease_seconds,
            batch_limit=BATCH_LIMIT,
            coalesce_seconds=settings.coalesce_window_seconds,
        )
        started_at = repo.db_now(session)
    if not taken:
        return report
    provider_name = taken[0]["provider"]
    report.provider, report.signals = provider_name, len(taken)
    look = _look(
        provider_for,
        breaker_for,
        provider_name,
        since=min(r["received_after"] for r in taken) - NEAR_MISS_LOOKBACK,
        recipients=frozenset(r["recipient"] for r in taken),
    )
    report.outcome = look.outcome.value
    batch_id = new_id("chk")
    with transaction() as session:
        candidates = _record_messages(session, provider_name, look.messages)
        now = repo.db_now(session)
        # Earlier signals get first pick of a message both would match.
        for row in sorted(taken, key=lambda r: (r["created_at"], r["id"])):
            _decide(
                session,
                settings,
                row,
                look,
                candidates,
                now=now,
                started_at=started_at,
                batch_id=batch_id,
                rng=rng,
                report=report,
            )
    publish(report.dead_letters)
    for pushed_id in report.pushed:
        dispatch.enqueue_check(pushed_id)
    return report


def _look(
    provider_for: Any,
    breaker_for: Any,
    provider_name: str,
    *,
    since: datetime,
    recipients: frozenset[str],
) -> _Look:
    """Ask the provider (through its breaker); every failure is an outcome."""
    try:
        provider: Provider = provider_for(provider_name)
    except SignalboxError as exc:  # e.g. removed from the providers file, secret unset
        log.warning(
            "provider cannot be built",
            extra={"event": "provider_misconfigured", "provider": provider_name, "error": exc.code},
        )
        return _Look(CheckOutcome.PROVIDER_ERROR, error_code="provider_misconfigured")
    breaker = _Guarded(breaker_for(provider_name), provider_name)
    admission = breaker.before_call()
    if not admission.allowed:
        wait = None if admission.retry_at is None else max(0.0, admission.retry_at - time.time())
        return _Look(CheckOutcome.CIRCUIT_OPEN, error_code="circuit_open", retry_after=wait)
    began = time.perf_counter()
    try:
        messages = provider.search(SearchQuery(since=since, recipients=recipients))
    except ProviderError as exc:
        metrics.provider_call(provider_name, time.perf_counter() - began)
        if exc.transient:
            breaker.record_failure(exc.retry_after)
        return _Look(
            CheckOutcome.PROVIDER_ERROR, error_code=exc.error_code, retry_after=exc.retry_after
        )
    except Exception as exc:  # a provider bug or garbage answer is an outcome, never a crash
        metrics.provider_call(provider_name, time.perf_counter() - began)
        breaker.record_failure(None)
        log.warning(
            "provider raised an unexpected error",
            extra={
                "event": "provider_crash",
                "provider": provider_name,
                "error": type(exc).__name__,
            },
        )
        return _Look(CheckOutcome.PROVIDER_ERROR, error_code="bad_response")
    metrics.provider_call(provider_name, time.perf_counter() - began)
    breaker.record_success()
    return _Look(CheckOutcome.NO_MATCH, messages=messages)


@dataclass(frozen=True)
class _Open:
    allowed: bool = True
    probe: bool = False
    retry_at: float | None = None


class _Guarded:
    """The breaker, failing open: when its Redis is unreachable the provider
    is still called (a check must not stop because the breaker's store did)."""

    def __init__(self, breaker: Breaker, provider: str) -> None:
        self._breaker, self._provider = breaker, provider

    def _warn(self, exc: Exception) -> None:
        log.warning(
            "circuit breaker unavailable; calling the provider anyway",
            extra={
                "event": "breaker_unavailable",
                "provider": self._provider,
                "error": type(exc).__name__,
            },
        )

    def before_call(self) -> Admission:
        try:
            return self._breaker.before_call()
        except Exception as exc:
            self._warn(exc)
            return _Open()

    def record_success(self) -> None:
        try:
            self._breaker.record_success()
        except Exception as exc:
            self._warn(exc)

    def record_failure(self, retry_after: float | None = None) -> None:
        try:
            self._breaker.record_failure(retry_after)
        except Exception as exc:
            self._warn(exc)


_PARSED: OrderedDict[tuple[str, str], ParsedMail] = OrderedDict()
PARSED_CACHE_ENTRIES = 4096
_PARSED_LOCK = threading.Lock()


def _parsed(provider: str, message: ProviderMessage) -> ParsedMail:
    """parse_mail, remembered per (provider, message id): a message never
    changes under its id, and every check of a mailbox sees it again."""
    key = (provider, message.provider_message_id)
    with _PARSED_LOCK:
        mail = _PARSED.get(key)
        if mail is not None:
            _PARSED.move_to_end(key)
            return mail
    mail = parse_mail(message.raw)
    with _PARSED_LOCK:
        _PARSED[key] = mail
        if len(_PARSED) > PARSED_CACHE_ENTRIES:
            _PARSED.popitem(last=False)
    return mail


def _record_messages(
    session: Session, provider: str, messages: Sequence[ProviderMessage]
) -> list[tuple[str, ProviderMessage, ParsedMail]]:
    """Record each observed message once; return (our id, message, parsed)."""
    if not messages:
        return []
    parsed = [(m, _parsed(provider, m)) for m in messages]
    messages_repo.message_record_many(
        session,
        [
            {
                "id": new_id("msg"),
                "provider": provider,
                "provider_message_id": m.provider_message_id,
                "received_at": m.received_at,
                "subject": p.subject,
                "recipients": sorted({a.lower() for a in (*m.envelope_recipients, *p.to, *p.cc)}),
                "run_marker": p.run_marker,
                "size": len(m.raw),
                "raw": m.raw,
            }
            for m, p in parsed
        ],
    )
    ids = messages_repo.message_ids_by_provider_id(
        session, provider, [m.provider_message_id for m in messages]
    )
    return [(ids[m.provider_message_id], m, p) for m, p in parsed if m.provider_message_id in ids]


def _decide(
    session: Session,
    settings: Settings,
    taken_row: Mapping[Any, Any],
    look: _Look,
    candidates: list[tuple[str, ProviderMessage, ParsedMail]],
    *,
    now: datetime,
    started_at: datetime,
    batch_id: str,
    rng: random.Random,
    report: CheckReport,
) -> None:
    signal_id, fence = taken_row["id"], taken_row["check_fence"]
    row = repo.signal_lock_fenced(session, signal_id, fence)
    if row is None:  # expired, redriven or re-checked meanwhile: not ours to write
        return
    reason = row["next_check_reason"] or CheckReason.SCHEDULED.value
    provider = row["provider"]
    log_extra = {
        "run_id": row["run_id"],
        "signal_id": signal_id,
        "recipient_hash": recipient_hash(row["recipient"]),
        "provider": provider,
        "reason": reason,
    }

    def record(outcome: CheckOutcome, error_code: str | None) -> None:
        repo.check_insert(
            session,
            signal_id=signal_id,
            generation=row["generation"],
            fence=fence,
            provider=provider,
            reason=reason,
            outcome=outcome.value,
            error_code=error_code,
            batch_id=batch_id,
            started_at=started_at,
        )
        metrics.check_recorded(provider, outcome.value)

    if look.outcome is CheckOutcome.NO_MATCH and candidates:
        winner = _match(session, row, candidates, fence=fence)
        if winner is not None:
            record(CheckOutcome.MATCHED, None)
            metrics.time_to_found(provider, (now - row["created_at"]).total_seconds())
            report.found.append(signal_id)
            log.info(
                "signal found", extra={"event": "signal_found", **log_extra, "message_id": winner}
            )
            return

    record(look.outcome, look.error_code)
    step = after_check(
        Counters(
            checks_count=row["checks_count"],
            max_checks=row["max_checks"],
            consecutive_errors=row["consecutive_errors"],
            expires_at=row["expires_at"],
        ),
        look.outcome,
        now=now,
        retry_after=look.retry_after,
        policy=BackoffPolicy(
            base_seconds=settings.backoff_base_seconds, cap_seconds=settings.backoff_cap_seconds
        ),
        max_provider_errors=settings.max_consecutive_provider_errors,
        rand=rng.random(),
    )
    _, pushed = repo.signal_record_check(
        session,
        signal_id,
        fence,
        outcome=look.outcome.value,
        error_code=look.error_code,
        counts=step.counts,
        consecutive_errors=step.consecutive_errors,
        next_check_at=step.next_check_at,
        next_check_reason=step.next_reason.value,
        started_at=started_at,
    )
    if step.expiry is None:
        if pushed:
            report.pushed.append(signal_id)
        return
    dead_letter = expire_signal(
        session, signal_id, expected=Status.WAITING, reason=step.expiry.value, fence=fence
    )
    if dead_letter:
        report.dead_letters.append(dead_letter)


def _match(
    session: Session,
    row: Mapping[Any, Any],
    candidates: list[tuple[str, ProviderMessage, ParsedMail]],
    *,
    fence: int,
) -> str | None:
    """Pick the earliest matching message and take it for the signal.

    A message satisfies at most one signal: the unique index on
    signals.message_id decides races between workers; the loser sees the
    message as taken and tries the next candidate.
    """
    criteria = Criteria(
        recipient=row["recipient"],
        run_id=row["run_id"],
        received_after=row["received_after"],
        subject_contains=row["subject_contains"],
        body_contains=row["body_contains"],
        require_run_marker=row["require_run_marker"],
    )
    taken_by = messages_repo.message_taken(session, [mid for mid, _, _ in candidates])
    excluded: set[str] = set()
    while True:
        result = pick(
            criteria,
            [
                Candidate(
                    message_id=mid,
                    received_at=m.received_at.astimezone(UTC),
                    mail=parsed,
                    envelope_recipients=tuple(a.lower() for a in m.envelope_recipients),
                    taken_by_other=(mid in excluded or taken_by.get(mid, row["id"]) != row["id"]),
                )
                for mid, m, parsed in candidates
            ],
        )
        for candidate, why in result.near_misses:
            if messages_repo.near_miss_record(session, row["id"], candidate.message_id, why.value):
                metrics.mismatch(row["provider"], why.value)
        if result.winner is None:
            return None
        mid = result.winner.message_id
        try:
            with session.begin_nested():
                if not repo.signal_mark_found(session, row["id"], fence, mid):
                    return None
            return mid
        except IntegrityError:
            excluded.add(mid)
