"""Transaction 2 of a check: record the observed messages, decide every
taken signal with the pure matcher and scheduler, and write each result
only if the signal's fence is still the one its check took."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

from app.db import checks as checks_db
from app.db import messages as messages_db
from app.db.checks import CheckRecord
from app.db.engine import autocommit, retryable, transaction
from app.domain.expectations import Expect
from app.domain.matching import Candidate, pick
from app.domain.ownership import sees
from app.domain.scheduling import NextStep, spends_budget
from app.domain.states import CheckOutcome, CheckReason, Status
from app.infra.keys import recipient_hash
from app.infra.parse_budget import parse_on_budget
from app.observability import metrics
from app.settings import Settings
from app.usecases.checks.call import ProviderAnswer
from app.usecases.checks.criteria import candidates_for, criteria_for
from app.usecases.checks.expectations import write_expectation
from app.usecases.checks.observed import Observed, Parser, note_recorded, record_messages
from app.usecases.checks.recipient_typos import record_typo_near_misses
from app.usecases.checks.step import next_step
from app.usecases.expiry import expire_signal
from app.usecases.visibility import belonging

log = logging.getLogger("signalbox.checks")

# A check's second transaction is retried this many times when PostgreSQL
# aborts it to break a deadlock or a serialization conflict.
TX_ATTEMPTS = 3

# A signal as its check took it (`takes_db.signal_lock_for_check`).
_Row = Mapping[Any, Any]


@dataclass(frozen=True)
class CheckBatch:
    """One check: the signals it took (transaction 1) and the provider's
    answer, with what every decision of the batch shares."""

    settings: Settings
    taken: Sequence[_Row]
    answer: ProviderAnswer
    precision: timedelta
    pushes: bool
    started_at: datetime
    batch_id: str
    rng: random.Random
    # `time.monotonic()` when the lock statement that stamped `started_at`
    # answered: the server's now is estimated from the two (`now`).
    started_monotonic: float
    # How this check parses a message it matches (the runner's parser).
    parse: Parser = parse_on_budget
    # Each signal's next step, decided once (`step`): the path of the write
    # is chosen on it, and a write made again keeps it.
    steps: dict[str, NextStep] = field(default_factory=dict, compare=False)

    def step(self, row: _Row, now: datetime) -> NextStep:
        """The next step of the signal `row` after this look (decided once)."""
        made = self.steps.get(row["id"])
        if made is None:
            made = self.steps[row["id"]] = next_step(
                self.settings,
                row,
                self.answer.outcome,
                reason=CheckReason(row["next_check_reason"] or CheckReason.SCHEDULED.value),
                looked_at=self.started_at,
                now=now,
                retry_after=self.answer.retry_after,
                rand=self.rng.random(),
                pushes=self.pushes,
            )
        return made

    def now(self) -> datetime:
        """The server's clock now, without asking it: `started_at` (its
        `clock_timestamp()` at the lock) plus the time elapsed here since that
        statement answered. It runs behind the server's by at most that
        statement's way back (well under a millisecond on a local network),
        and serves only to schedule the next look and to measure time to
        found: no deadline is decided on it (a final look is one that
        *began* at or after the deadline, `started_at`)."""
        return self.started_at + timedelta(seconds=time.monotonic() - self.started_monotonic)


class Effects:
    """What a check's transaction did, emitted once it committed (a retried
    transaction must not count a metric twice)."""

    def __init__(self) -> None:
        self.checks: list[tuple[str, str]] = []
        self.mismatches: list[tuple[str, str]] = []
        self.found: list[tuple[str, float]] = []
        self.dead_letters: list[str] = []
        self.pushed: list[str] = []
        self.logs: list[tuple[str, dict[str, Any]]] = []
        # (provider, provider message id) of every message the write recorded or found recorded.
        self.recorded: list[tuple[str, str]] = []

    def emit(self) -> None:
        """Count the metrics, write the log lines and remember the recorded messages."""
        note_recorded(self.recorded)
        for provider, outcome in self.checks:
            metrics.check_recorded(provider, outcome)
        for provider, why in self.mismatches:
            metrics.mismatch(provider, why)
        for provider, seconds in self.found:
            metrics.time_to_found(provider, seconds)
        for message, extra in self.logs:
            log.info(message, extra=extra)


def _one_statement_write(batch: CheckBatch) -> bool:
    """Whether `batch`'s write may be one fenced statement: one `first`
    signal and no message seen (the usual look before the mail arrives), and
    its next step, decided first, no expiry (the check and the expiry are
    written together). It then commits alone: no BEGIN and COMMIT round trips."""
    if len(batch.taken) != 1 or batch.answer.messages or batch.taken[0]["expect"] != Expect.FIRST:
        return False
    return batch.step(batch.taken[0], batch.now()).expiry is None


def write_answer(batch: CheckBatch, signal_id: str) -> Effects:
    """Transaction 2 for `batch` (checked on behalf of `signal_id`), written
    again when PostgreSQL aborts it to break a deadlock or a conflict; its
    effects are the caller's to emit. A write of one statement
    (`_one_statement_write`) is made outside a transaction. Each signal's
    next step is decided once (`CheckBatch.step`), whichever path and
    attempt writes it."""
    if _one_statement_write(batch):
        effects = Effects()
        try:
            with autocommit() as session:
                _Writer(session, batch, effects, one_statement=True).write()
            return effects
        except OperationalError as exc:
            if not retryable(exc):
                raise
            # The statement wrote nothing: written again in a transaction, retried.
    attempt = 1
    while True:
        effects = Effects()
        try:
            with transaction() as session:
                _Writer(session, batch, effects).write()
            return effects
        except OperationalError as exc:
            if attempt == TX_ATTEMPTS or not retryable(exc):
                raise
            log.info(
                "check result collided with another transaction; writing it again",
                extra={"event": "check_write_retry", "signal_id": signal_id, "attempt": attempt},
            )
        attempt += 1


class _Writer:
    """One attempt at transaction 2, in `session`; what it did goes to `effects`."""

    def __init__(
        self,
        session: Connection,
        batch: CheckBatch,
        effects: Effects,
        *,
        one_statement: bool = False,
    ) -> None:
        self.session, self.batch, self.effects = session, batch, effects
        # Outside a transaction: every write must be one statement.
        self.one_statement = one_statement
        # In a transaction, the no-match writes and the near misses of all
        # the look's signals wait here and go in one statement each
        # (`_flush`): a push look at a shared address decides hundreds of
        # signals, and two round trips each were most of its time.
        self._checks: list[checks_db.CheckWrite] = []
        self._misses: list[tuple[str, str, str, Sequence[str], str | None]] = []
        # Each observed message's candidate, free and taken, made once for
        # all the signals.
        self._candidates: dict[tuple[str, bool], Candidate] = {}

    def write(self) -> None:
        """Record the messages, decide and write every signal.

        Each signal is decided on the row its check took (under the check's
        lease and fence, nobody else changes what the decision reads) and
        written by one fenced statement: no row is held locked while Python
        decides."""
        session, taken = self.session, self.batch.taken
        observed = record_messages(
            session, taken[0]["provider"], self.batch.answer.messages, parse=self.batch.parse
        )
        self.effects.recorded.extend(
            (taken[0]["provider"], o.message.provider_message_id) for o in observed
        )
        now = self.batch.now()
        belongs: dict[str, frozenset[str]] = {}
        taken_by: dict[str, dict[str, str]] = {}
        if observed:
            belongs = belonging(
                session,
                self.batch.settings,
                (
                    (o.message_id, o.message.received_at, o.delivered_to, o.message.auth_namespace)
                    for o in observed
                ),
            )
            # A message this transaction recorded is no signal's yet: only
            # the others are asked after (the usual push look asks nothing).
            ids = [o.message_id for o in observed if not o.recorded_now]
            if ids:
                messages_db.message_lock_many(session, ids)
            for namespace in sorted({r["namespace"] for r in taken}):
                taken_by[namespace] = (
                    messages_db.message_taken(session, ids, namespace) if ids else {}
                )
        # Earlier signals get first pick of a message both would match.
        for row in sorted(taken, key=lambda r: (r["created_at"], r["id"])):
            # A namespace sees only the mail that belongs to it, in every
            # path: matches, near misses, messages_seen.
            mine = [o for o in observed if sees(row["namespace"], belongs[o.message_id])]
            # Mail received after the deadline is late mail (the dead letter's
            # late_message), never the signal's: a final check that ran late
            # must not take it.
            in_time = [o for o in mine if o.message.received_at <= row["expires_at"]]
            self._decide(row, in_time, len(mine), taken_by.get(row["namespace"], {}), now)
        self._flush()

    def _flush(self) -> None:
        """Write the no-match writes and near misses waiting in the buffers.
        Anything that reads a signal's near misses or its check rows in this
        transaction (an expiry's diagnosis) comes after a flush, and so does
        any write of a signal made at once (found, expired, an expectation
        decided), so that the look locks its signals oldest first, as a
        push does, and the two never wait for each other in opposite orders."""
        provider = self.batch.taken[0]["provider"]
        if self._misses:
            fences = {r["id"]: r["check_fence"] for r in self.batch.taken}
            new = messages_db.near_misses_record(self.session, self._misses, fences)
            self.effects.mismatches.extend((provider, why) for _, why in new)
            self._misses = []
        if self._checks:
            outcome = {w.signal_id: w.check.outcome for w in self._checks}
            written = checks_db.signal_record_checks(self.session, self._checks)
            self._checks = []
            for signal_id, pushed in written.items():
                self.effects.checks.append((provider, outcome[signal_id]))
                if pushed:
                    self.effects.pushed.append(signal_id)

    def _decide(
        self,
        row: _Row,
        observed: list[Observed],
        seen_here: int,
        taken_by: dict[str, str],
        now: datetime,
    ) -> None:
        session, batch, effects = self.session, self.batch, self.effects
        signal_id, fence = row["id"], row["check_fence"]
        reason = CheckReason(row["next_check_reason"] or CheckReason.SCHEDULED.value)
        provider = row["provider"]
        answer, settings = batch.answer, batch.settings

        def log_extra() -> dict[str, Any]:
            # Made only for a line logged: the hash is an HMAC, and a push
            # look at a shared address decides hundreds of signals that log nothing.
            return {
                "run_id": row["run_id"],
                "signal_id": signal_id,
                "recipient_hash": recipient_hash(row["recipient"], settings),
                "provider": provider,
                "reason": reason.value,
            }

        # What this signal's namespace saw of the look (never another's mail).
        seen = seen_here if answer.outcome is CheckOutcome.NO_MATCH else None

        def check_record(
            outcome: CheckOutcome, error_code: str | None, counted: bool
        ) -> CheckRecord:
            return CheckRecord(
                reason=reason.value,
                outcome=outcome.value,
                error_code=error_code,
                batch_id=batch.batch_id,
                started_at=batch.started_at,
                counted=counted,
                messages_seen=seen,
            )

        if answer.outcome is CheckOutcome.NO_MATCH and row["expect"] != Expect.FIRST:
            self._flush()  # the older signals are written (locked) before this one
            if self._expectation(row, observed, taken_by, check_record, log_extra, now):
                return
        elif answer.outcome is CheckOutcome.NO_MATCH and observed:
            record = check_record(
                CheckOutcome.MATCHED, None, spends_budget(reason, CheckOutcome.MATCHED, None)
            )
            winner = self._match(row, observed, taken_by, record)
            if winner is not None:
                effects.checks.append((provider, CheckOutcome.MATCHED.value))
                effects.found.append((provider, (now - row["created_at"]).total_seconds()))
                effects.logs.append(
                    ("signal found", {"event": "signal_found", **log_extra(), "message_id": winner})
                )
                return

        step = batch.step(row, now)
        # A one-statement write was chosen on this step: it expires nothing.
        assert not (self.one_statement and step.expiry is not None)
        write = checks_db.CheckWrite(
            signal_id,
            fence,
            check_record(answer.outcome, answer.error_code, step.counts),
            consecutive_errors=step.consecutive_errors,
            next_check_at=step.next_check_at,
            next_check_reason=step.next_reason.value,
        )
        if not self.one_statement and step.expiry is None:
            self._checks.append(write)
            return
        # The expiry's diagnosis reads the near misses and checks written so far.
        self._flush()
        written = checks_db.signal_record_checks(session, [write])
        if signal_id not in written:  # expired, redriven or re-checked meanwhile: not ours
            return
        pushed = written[signal_id]
        effects.checks.append((provider, answer.outcome.value))
        if step.expiry is None:
            if pushed:
                effects.pushed.append(signal_id)
            return
        dead_letter = expire_signal(
            session,
            signal_id,
            expected=Status.WAITING,
            reason=step.expiry.value,
            fence=fence,
            typo_look=partial(record_typo_near_misses, parse=self.batch.parse),
        )
        if dead_letter:
            effects.dead_letters.append(dead_letter)

    def _expectation(
        self,
        row: _Row,
        observed: list[Observed],
        taken_by: dict[str, str],
        check_record: Callable[[CheckOutcome, str | None, bool], CheckRecord],
        log_extra: Callable[[], dict[str, Any]],
        now: datetime,
    ) -> bool:
        """An `exactly_one` or `none` signal after a look that saw the provider
        (`app.usecases.checks.expectations`); False when the look decided
        nothing and the usual schedule follows."""
        effects, provider = self.effects, row["provider"]
        written = write_expectation(
            self.session,
            row,
            observed,
            taken_by,
            precision=self.batch.precision,
            looked_at=self.batch.started_at,
            record=lambda outcome, counted: check_record(outcome, None, counted),
            parse=self.batch.parse,
        )
        effects.mismatches.extend((provider, why) for why in written.near_misses)
        if not written.decided:
            return False
        if written.outcome is not None:
            effects.checks.append((provider, written.outcome.value))
        if written.found:
            effects.found.append((provider, (now - row["created_at"]).total_seconds()))
        if written.event is not None:
            extra = {"event": written.event, **log_extra(), "message_id": written.message_id}
            effects.logs.append((written.event.replace("_", " "), extra))
        if written.dead_letter:
            effects.dead_letters.append(written.dead_letter)
        if written.pushed:
            effects.pushed.append(row["id"])
        return True

    def _candidates_of(
        self, observed: list[Observed], taken_by_other: Callable[[str], bool]
    ) -> list[Candidate]:
        """`candidates_for(observed, taken_by_other)`, each message's candidate
        made once per look as this signal sees it: free, or taken (the
        messages earlier looks gave to found signals are taken for every
        signal still waiting)."""
        made, out = self._candidates, []
        for o in observed:
            taken = taken_by_other(o.message_id)
            candidate = made.get((o.message_id, taken))
            if candidate is None:
                (candidate,) = candidates_for([o], (lambda _: True) if taken else (lambda _: False))
                made[o.message_id, taken] = candidate
            out.append(candidate)
        return out

    def _match(
        self,
        row: _Row,
        observed: list[Observed],
        taken_by: dict[str, str],
        record: CheckRecord,
    ) -> str | None:
        """Pick the earliest matching message and take it for the signal.

        A message satisfies at most one signal per namespace: the unique index
        on (namespace, message_id) decides races between workers; the loser
        sees the message as taken and tries the next candidate. A message
        this transaction recorded cannot be refused (no one else knows its id
        before the commit, and a signal of this batch that took it marked it
        in `taken_by`), so it is taken without a savepoint's two round trips.
        """
        session = self.session
        criteria = criteria_for(
            row, self.batch.precision, text_max_bytes=self.batch.settings.match_text_max_bytes
        )
        excluded: set[str] = set()
        fresh = {o.message_id for o in observed if o.recorded_now}

        def taken_by_other(mid: str) -> bool:
            return mid in excluded or taken_by.get(mid, row["id"]) != row["id"]

        while True:
            result = pick(criteria, self._candidates_of(observed, taken_by_other))
            signal_id = row["id"]
            self._misses.extend(
                (signal_id, n.candidate.message_id, n.why.value, n.also, None)
                for n in result.near_misses
            )
            if result.winner is None:
                return None
            mid = result.winner.message_id
            # The older signals are written (locked) before this one, as a
            # push locks them; outside the savepoint, which a refused take undoes.
            self._flush()
            try:
                with nullcontext() if mid in fresh else session.begin_nested():
                    if not checks_db.signal_mark_found(
                        session, row["id"], row["check_fence"], mid, record
                    ):
                        return None
                taken_by[mid] = row["id"]  # later signals of this batch see it taken
                return mid
            except IntegrityError:
                if mid in fresh:
                    raise  # the transaction is lost without a savepoint: the look fails
                excluded.add(mid)
