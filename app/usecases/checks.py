"""The check use case: one look at a provider on behalf of its due signals.

Short locks: transaction 1 takes the due signals of one provider
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol

import psycopg
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from app.db import checks as checks_db
from app.db import mailboxes as mailboxes_db
from app.db import messages as messages_db
from app.db import server as server_db
from app.db.checks import CheckRecord
from app.db.engine import transaction
from app.domain.backoff import BackoffPolicy
from app.domain.ids import new_id, recipient_hash
from app.domain.mail import ParsedMail, parse_mail
from app.domain.matching import Candidate, Criteria, floor_to, pick
from app.domain.ownership import may_use, owner_of
from app.domain.scheduling import Counters, after_check, spends_budget
from app.domain.states import CheckOutcome, CheckReason, Status
from app.errors import ProviderError
from app.infra import dispatch
from app.observability import metrics
from app.providers.base import Provider, ProviderMessage, SearchQuery
from app.settings import Settings
from app.usecases.expiry import expire_signal, publish

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
class ProviderAnswer:
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
    resend_pushed: bool = True,
    bulkhead_for: Any = None,
) -> CheckReport:
    """Check `signal_id` and the other due signals of its provider.

    `provider_for(name) -> Provider` and `breaker_for(name) -> Breaker` are
    injected by the front door (the Celery task, or `check_in_process`'s caller).
    Signals pushed while the check ran are sent a task unless
    `resend_pushed` is False (the caller looks at `report.pushed` itself).
    `bulkhead_for(name) -> Bulkhead` (a worker's, see app/providers/bulkhead.py)
    bounds how many of this worker's processes call a polled provider at
    once; a check refused a slot is `circuit_open` / `provider_busy`.
    """
    rng = rng or random.Random()
    report = CheckReport()
    with transaction() as session:
        taken = checks_db.signal_lock_for_check(
            session,
            signal_id,
            lease_seconds=settings.check_lease_seconds,
            batch_limit=BATCH_LIMIT,
            coalesce_seconds=settings.coalesce_window_seconds,
        )
    if not taken:
        return report
    provider_name = taken[0]["provider"]
    looked_at = taken[0]["looked_at"]
    report.provider, report.signals = provider_name, len(taken)
    fences = [(r["id"], r["check_fence"]) for r in taken]
    with _LeaseKeeper(fences, settings.check_lease_seconds) as keeper:
        provider, look = provider_or_error(provider_for, provider_name)
        precision = getattr(provider, "timestamp_precision", timedelta(0))
        pushes = bool(getattr(provider, "pushes", False))
        if provider is not None:
            # A final look (at or after a deadline) is the one expiry waits
            # for: an open breaker does not skip it.
            final = any(r["looked_at"] >= r["expires_at"] for r in taken)
            # A polled provider's call holds this process as long as it takes:
            # the bulkhead keeps a slow one from holding every process.
            bulkhead = None if pushes else _bulkhead(bulkhead_for, provider_name)
            look = _ask_in_bulkhead(
                bulkhead, keeper, provider, breaker_for, _query(taken, precision), final=final
            )
    report.outcome = look.outcome.value
    batch_id = new_id("chk")
    for attempt in range(1, TX_ATTEMPTS + 1):
        effects = _Effects()
        try:
            with transaction() as session:
                _write(
                    session,
                    settings,
                    taken,
                    look,
                    precision=precision,
                    pushes=pushes,
                    started_at=looked_at,
                    batch_id=batch_id,
                    rng=rng,
                    effects=effects,
                )
            break
        except OperationalError as exc:
            if attempt == TX_ATTEMPTS or not _retryable(exc):
                raise
            log.info(
                "check result collided with another transaction; writing it again",
                extra={"event": "check_write_retry", "signal_id": signal_id, "attempt": attempt},
            )
    effects.emit(report)
    publish(report.dead_letters)
    if resend_pushed:
        for pushed_id in report.pushed:
            dispatch.enqueue_check(pushed_id)
    return report


# Makes the check of a signal's provider batch in this process (`check_in_process`).
InProcessCheck = Callable[[str], object]


def in_process_check_for(settings: Settings) -> InProcessCheck:
    """`check_in_process` with this process's providers and breakers: what the sink
    and beat pass to the push and the sweep."""
    from app.providers.breaker import breaker_for
    from app.providers.runtime import provider_for

    return partial(check_in_process, settings, provider_for=provider_for, breaker_for=breaker_for)


# How many times `check_in_process` looks again at signals pushed while it looked,
# before it leaves them to a task.
IN_PROCESS_ROUNDS = 3


def check_in_process(
    settings: Settings, signal_id: str, *, provider_for: Any, breaker_for: Any
) -> CheckReport:
    """Make the check of `signal_id` (and its provider's other due signals)
    in this process, not through a worker.

    For a provider that pushes (the sink), whose look is a database query,
    the sink makes it where the push is made and beat where the sweep finds
    it due. So a backlog of slow provider calls holding every worker
    process, or a worker killed with the task it reserved, cannot keep the
    look from being made before the deadline. The check is the same use
    case, with the same lease, fence and history, as a worker's.
    """
    report = run_check(
        settings, signal_id, provider_for=provider_for, breaker_for=breaker_for, resend_pushed=False
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
    check_here: InProcessCheck, signal_id: str, provider: str, *, event: str, message: str
) -> bool:
    """Make `check_here(signal_id)`; a failure is logged (with `event`), not
    raised: the look's signals stay due and the sweep looks again."""
    try:
        check_here(signal_id)
        return True
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
        return False


def _ask_in_bulkhead(
    bulkhead: Any,
    keeper: _LeaseKeeper,
    provider: Provider,
    breaker_for: Any,
    query: SearchQuery,
    *,
    final: bool,
) -> ProviderAnswer:
    """`ask_provider` holding a slot of `bulkhead` (None: no bulkhead), renewed
    with the check lease; no slot free: `circuit_open` / `provider_busy`,
    and no call."""
    slot = bulkhead.acquire() if bulkhead is not None else None
    if bulkhead is not None and slot is None:
        return ProviderAnswer(CheckOutcome.CIRCUIT_OPEN, error_code="provider_busy")
    keeper.also = slot.renew if slot is not None else None
    try:
        return ask_provider(provider, breaker_for, query, final=final)
    finally:
        keeper.also = None
        if slot is not None:
            slot.release()


def _bulkhead(bulkhead_for: Any, provider_name: str) -> Any:
    """The provider's bulkhead, or None (no bulkhead here, or it cannot be
    built: the call is made, as with a breaker that cannot be asked)."""
    if bulkhead_for is None:
        return None
    try:
        return bulkhead_for(provider_name)
    except Exception as exc:
        log.warning(
            "provider bulkhead unavailable; calling the provider anyway",
            extra={
                "event": "bulkhead_unavailable",
                "provider": provider_name,
                "error": type(exc).__name__,
            },
        )
        return None


# A check's second transaction is retried this many times when PostgreSQL
# aborts it to break a deadlock or a serialization conflict.
TX_ATTEMPTS = 3


def _retryable(exc: OperationalError) -> bool:
    return isinstance(
        getattr(exc, "orig", None),
        psycopg.errors.DeadlockDetected
        | psycopg.errors.SerializationFailure
        | psycopg.errors.LockNotAvailable,
    )


def _minus(moment: datetime, delta: timedelta) -> datetime:
    try:
        return moment - delta
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def _query(taken: Sequence[Mapping[Any, Any]], precision: timedelta) -> SearchQuery:
    """One search for the batch: each recipient from the earliest window of
    its signals (floored to the provider's precision), plus the near-miss
    lookback before the earliest one."""
    windows: dict[str, datetime] = {}
    for r in taken:
        opens = floor_to(r["received_after"].astimezone(UTC), precision)
        recipient = r["recipient"].lower()
        windows[recipient] = min(opens, windows.get(recipient, opens))
    return SearchQuery(
        since=_minus(min(windows.values()), NEAR_MISS_LOOKBACK),
        recipients=frozenset(windows),
        windows=windows,
    )


class _LeaseKeeper:
    """Heartbeat the check lease of the taken signals while the provider is
    asked, so a call slower than the lease still counts (and no other worker
    takes the signals meanwhile). A worker that dies stops beating: its
    lease lapses and the sweep sends the check again."""

    def __init__(self, fences: Sequence[tuple[str, int]], lease_seconds: float) -> None:
        self.fences = list(fences)
        self.lease = lease_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="check-lease", daemon=True)
        # Renewed with the lease while set (the provider call's bulkhead slot).
        self.also: Callable[[], None] | None = None

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                also = self.also
                if also is not None:
                    also()
                with transaction() as session:
                    checks_db.signal_extend_check_leases(session, self.fences, self.lease)
            except Exception as exc:  # the next beat may succeed; the lease is the backstop
                log.warning(
                    "could not extend a check lease",
                    extra={"event": "check_lease_heartbeat_failed", "error": type(exc).__name__},
                )


def provider_or_error(
    provider_for: Any, provider_name: str
) -> tuple[Provider | None, ProviderAnswer]:
    """Build the provider; a missing or misconfigured one is an outcome."""
    try:
        provider: Provider = provider_for(provider_name)
    except Exception as exc:  # removed from the providers file, secret unset, bad options
        log.warning(
            "provider cannot be built",
            extra={
                "event": "provider_misconfigured",
                "provider": provider_name,
                "error": getattr(exc, "code", type(exc).__name__),
            },
        )
        return None, ProviderAnswer(
            CheckOutcome.PROVIDER_ERROR, error_code="provider_misconfigured"
        )
    return provider, ProviderAnswer(CheckOutcome.NO_MATCH)


def ask_provider(
    provider: Provider, breaker_for: Any, query: SearchQuery, *, final: bool = False
) -> ProviderAnswer:
    """Ask the provider (through its breaker); every failure is an outcome.

    A `final` look is made even when the breaker is open (it still records
    its outcome): skipping it would leave the signal to expire unseen, and
    it costs the provider one call per batch of signals past their deadline.
    """
    provider_name = provider.name
    try:
        breaker = _Guarded(breaker_for(provider_name), provider_name)
    except Exception as exc:
        breaker = _Guarded(_Unavailable(exc), provider_name)
    admission = breaker.before_call()
    if not admission.allowed and not final:
        wait = None if admission.retry_at is None else max(0.0, admission.retry_at - time.time())
        return ProviderAnswer(
            CheckOutcome.CIRCUIT_OPEN, error_code="circuit_open", retry_after=wait
        )
    began = time.perf_counter()
    try:
        messages = provider.search(query)
    except ProviderError as exc:
        metrics.provider_call(provider_name, time.perf_counter() - began)
        if exc.transient:
            breaker.record_failure(exc.retry_after)
        return ProviderAnswer(
            CheckOutcome.PROVIDER_ERROR, error_code=exc.error_code, retry_after=exc.retry_after
        )
    except Exception as exc:  # a provider bug, garbage answer or time limit: an outcome
        metrics.provider_call(provider_name, time.perf_counter() - began)
        breaker.record_failure(None)
        timed_out = type(exc).__name__ == "SoftTimeLimitExceeded"
        log.warning(
            "provider raised an unexpected error",
            extra={
                "event": "provider_crash",
                "provider": provider_name,
                "error": type(exc).__name__,
            },
        )
        return ProviderAnswer(
            CheckOutcome.PROVIDER_ERROR, error_code="timeout" if timed_out else "bad_response"
        )
    metrics.provider_call(provider_name, time.perf_counter() - began)
    breaker.record_success()
    return ProviderAnswer(CheckOutcome.NO_MATCH, messages=messages)


class _Unavailable:
    """A breaker that could not be built: every call raises, so `_Guarded`
    fails open."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def before_call(self) -> Admission:
        raise self.exc

    def record_success(self) -> None:
        raise self.exc

    def record_failure(self, retry_after: float | None = None) -> None:
        raise self.exc


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
# How this process parses a message it matches. A worker parses in its own
# main thread, where parse_mail's CPU budget applies; the sink, whose looks
# run in threads beside its event loop, parses in its parse pool.
_parse: Callable[[bytes], ParsedMail] = parse_mail


def parse_with(parse: Callable[[bytes], ParsedMail]) -> None:
    """Make this process's checks parse messages with `parse`."""
    global _parse
    _parse = parse


def _parsed(provider: str, message: ProviderMessage) -> ParsedMail:
    """parse_mail, remembered per (provider, message id): a message never
    changes under its id, and every check of a mailbox sees it again."""
    key = (provider, message.provider_message_id)
    with _PARSED_LOCK:
        mail = _PARSED.get(key)
        if mail is not None:
            _PARSED.move_to_end(key)
            return mail
    mail = _parse(message.raw)
    with _PARSED_LOCK:
        _PARSED[key] = mail
        if len(_PARSED) > PARSED_CACHE_ENTRIES:
            _PARSED.popitem(last=False)
    return mail


def record_messages(
    session: Session, provider: str, messages: Sequence[ProviderMessage]
) -> list[tuple[str, ProviderMessage, ParsedMail]]:
    """Record each observed message once; return (our id, message, parsed)."""
    if not messages:
        return []
    parsed = [(m, _parsed(provider, m)) for m in messages]
    ids = messages_db.message_record_new(
        session,
        provider,
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
    return [(ids[m.provider_message_id], m, p) for m, p in parsed if m.provider_message_id in ids]


class _Effects:
    """What a check's transaction did, emitted once it committed (a retried
    transaction must not count a metric twice)."""

    def __init__(self) -> None:
        self.checks: list[tuple[str, str]] = []
        self.mismatches: list[tuple[str, str]] = []
        self.found: list[tuple[str, float]] = []
        self.dead_letters: list[str] = []
        self.pushed: list[str] = []
        self.logs: list[tuple[str, dict[str, Any]]] = []

    def emit(self, report: CheckReport) -> None:
        for provider, outcome in self.checks:
            metrics.check_recorded(provider, outcome)
        for provider, why in self.mismatches:
            metrics.mismatch(provider, why)
        for provider, seconds in self.found:
            metrics.time_to_found(provider, seconds)
        for message, extra in self.logs:
            log.info(message, extra=extra)
        report.dead_letters.extend(self.dead_letters)
        report.pushed.extend(self.pushed)


def _write(
    session: Session,
    settings: Settings,
    taken: Sequence[Mapping[Any, Any]],
    look: ProviderAnswer,
    *,
    precision: timedelta,
    pushes: bool,
    started_at: datetime,
    batch_id: str,
    rng: random.Random,
    effects: _Effects,
) -> None:
    """Transaction 2: record the messages, decide and write every signal.

    Each signal is decided on the row its check took (under the check's
    lease and fence, nobody else changes what the decision reads) and
    written by one fenced statement: no row is held locked while Python
    decides."""
    provider_name = taken[0]["provider"]
    candidates = record_messages(session, provider_name, look.messages)
    now = server_db.db_now(session)
    owners: dict[str, str | None] = {}
    taken_by: dict[str, dict[str, str]] = {}
    if candidates:
        owners = recipient_owners(session, settings, {r["recipient"] for r in taken})
        ids = [mid for mid, _, _ in candidates]
        for namespace in sorted({r["namespace"] for r in taken}):
            taken_by[namespace] = messages_db.message_taken(session, ids, namespace)
    # Earlier signals get first pick of a message both would match.
    for row in sorted(taken, key=lambda r: (r["created_at"], r["id"])):
        # Mail received after the deadline is late mail (the dead letter's
        # late_message), never the signal's: a final look that ran late must
        # not take it.
        visible = [
            c
            for c in candidates
            if c[1].received_at <= row["expires_at"]
            and may_use(row["namespace"], owners.get(row["recipient"]))
        ]
        _decide(
            session,
            settings,
            row,
            look,
            visible,
            taken_by.get(row["namespace"], {}),
            precision=precision,
            pushes=pushes,
            now=now,
            started_at=started_at,
            batch_id=batch_id,
            rng=rng,
            effects=effects,
        )


def recipient_owners(
    session: Session, settings: Settings, recipients: set[str]
) -> dict[str, str | None]:
    """recipient → owning namespace (None: shared)."""
    mailboxes = mailboxes_db.mailbox_owner_many(session, sorted(recipients))
    domains = settings.namespace_domain_owners
    return {r: owner_of(r, domains, mailboxes.get(r.lower())) for r in recipients}


def _decide(
    session: Session,
    settings: Settings,
    row: Mapping[Any, Any],
    look: ProviderAnswer,
    candidates: list[tuple[str, ProviderMessage, ParsedMail]],
    taken_by: dict[str, str],
    *,
    precision: timedelta,
    pushes: bool,
    now: datetime,
    started_at: datetime,
    batch_id: str,
    rng: random.Random,
    effects: _Effects,
) -> None:
    signal_id, fence = row["id"], row["check_fence"]
    reason = CheckReason(row["next_check_reason"] or CheckReason.SCHEDULED.value)
    provider = row["provider"]
    log_extra = {
        "run_id": row["run_id"],
        "signal_id": signal_id,
        "recipient_hash": recipient_hash(row["recipient"]),
        "provider": provider,
        "reason": reason.value,
    }

    def check_record(outcome: CheckOutcome, error_code: str | None, counted: bool) -> CheckRecord:
        return CheckRecord(
            reason=reason.value,
            outcome=outcome.value,
            error_code=error_code,
            batch_id=batch_id,
            started_at=started_at,
            counted=counted,
            messages_seen=len(look.messages) if look.outcome is CheckOutcome.NO_MATCH else None,
        )

    if look.outcome is CheckOutcome.NO_MATCH and candidates:
        record = check_record(
            CheckOutcome.MATCHED, None, spends_budget(reason, CheckOutcome.MATCHED, None)
        )
        winner = _match(
            session, row, candidates, taken_by, precision=precision, record=record, effects=effects
        )
        if winner is not None:
            effects.checks.append((provider, CheckOutcome.MATCHED.value))
            effects.found.append((provider, (now - row["created_at"]).total_seconds()))
            effects.logs.append(
                ("signal found", {"event": "signal_found", **log_extra, "message_id": winner})
            )
            return

    step = after_check(
        Counters(
            checks_count=row["checks_count"],
            max_checks=row["max_checks"],
            consecutive_errors=row["consecutive_errors"],
            expires_at=row["expires_at"],
        ),
        look.outcome,
        reason=reason,
        looked_at=started_at,
        now=now,
        retry_after=look.retry_after,
        policy=BackoffPolicy(
            base_seconds=settings.backoff_base_seconds, cap_seconds=settings.backoff_cap_seconds
        ),
        max_provider_errors=settings.max_consecutive_provider_errors,
        rand=rng.random(),
        pushes=pushes,
    )
    written, pushed = checks_db.signal_record_check(
        session,
        signal_id,
        fence,
        check_record(look.outcome, look.error_code, step.counts),
        consecutive_errors=step.consecutive_errors,
        next_check_at=step.next_check_at,
        next_check_reason=step.next_reason.value,
    )
    if not written:  # expired, redriven or re-checked meanwhile: not ours to write
        return
    effects.checks.append((provider, look.outcome.value))
    if step.expiry is None:
        if pushed:
            effects.pushed.append(signal_id)
        return
    dead_letter = expire_signal(
        session, signal_id, expected=Status.WAITING, reason=step.expiry.value, fence=fence
    )
    if dead_letter:
        effects.dead_letters.append(dead_letter)


def _match(
    session: Session,
    row: Mapping[Any, Any],
    candidates: list[tuple[str, ProviderMessage, ParsedMail]],
    taken_by: dict[str, str],
    *,
    precision: timedelta,
    record: CheckRecord,
    effects: _Effects,
) -> str | None:
    """Pick the earliest matching message and take it for the signal.

    A message satisfies at most one signal per namespace: the unique index on
    (namespace, message_id) decides races between workers; the loser sees
    the message as taken and tries the next candidate.
    """
    criteria = Criteria(
        recipient=row["recipient"],
        run_id=row["run_id"],
        received_after=row["received_after"],
        subject_contains=row["subject_contains"],
        body_contains=row["body_contains"],
        require_run_marker=row["require_run_marker"],
        precision=precision,
    )
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
        new = messages_db.near_miss_record_many(
            session, row["id"], [(c.message_id, why.value) for c, why in result.near_misses]
        )
        effects.mismatches.extend((row["provider"], why) for why in new)
        if result.winner is None:
            return None
        mid = result.winner.message_id
        try:
            with session.begin_nested():
                if not checks_db.signal_mark_found(
                    session, row["id"], row["check_fence"], mid, record
                ):
                    return None
            taken_by[mid] = row["id"]  # later signals of this batch see it taken
            return mid
        except IntegrityError:
            excluded.add(mid)
