"""A new sink signal's first look in one statement, when the sink holds no
mail for it.

Most first looks come before the mail: the test creates the signal, then
makes the application send. The whole look is then three units of work
(take the signal under a lease, search the sink, write `no_match`), a
breaker round trip and a lease heartbeat, all to learn that the sink holds
nothing for the address. Here the same look is one statement
(`takes_db.signal_first_look_if_empty`): it takes the signal only as its
create left it, searches the sink in the same snapshot and writes the check
row and the next check exactly as the whole look would. When the sink holds
any mail the look could see (in the window or a near miss before it), or
anything else is not as simple (another check or a push took the signal,
the breaker has failures or is open, the deadline has passed, a signal
that expects something other than its first match), nothing is written and
the runner makes the whole look (`app.usecases.checks.runner`).

Why a mail is not missed: it is stored (committed) before its push makes the
signal due again. Stored before this statement's snapshot, the statement
sees it and writes nothing. Stored after, its push either waits for this
statement's row lock and makes the signal due when it commits, or has
already changed the row, which the lock re-reads and then does not take.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app.db import takes as takes_db
from app.db.create_look import FirstLook
from app.db.engine import autocommit
from app.domain.expectations import Expect
from app.domain.ids import new_id
from app.domain.scheduling import NextStep
from app.domain.states import CheckOutcome, CheckReason
from app.observability import metrics
from app.settings import Settings
from app.usecases.checks.criteria import NEAR_MISS_LOOKBACK
from app.usecases.checks.step import next_step


def first_look_if_empty(
    settings: Settings,
    signal: Mapping[str, Any],
    *,
    provider_for: Any,
    breaker_for: Any,
    rng: random.Random | None = None,
    session: Connection | None = None,
) -> bool:
    """Make the first look of `signal` (its row as the create returned it) in
    one statement; True when it was made and written, False when the caller
    must make the whole look (nothing was written). Raises what the database
    or the breaker's Redis raised; nothing is written then either.

    `session`: an autocommit connection the create committed on, reused for
    the look (its statement commits on its own, after the create's); else
    one is checked out."""
    if signal["expect"] != Expect.FIRST or signal["next_check_reason"] != CheckReason.FIRST:
        return False
    due_at: datetime = signal["next_check_at"]
    # The look begins after the create (the statement checks it is due and
    # before the deadline); a sink's next look after one that found nothing
    # is the deadline's, whatever the moment taken here.
    now = max(due_at, signal.get("view_now") or due_at)
    step = _quick_step(settings, signal, now, provider_for, breaker_for, rng)
    if step is None:
        return False
    began = time.perf_counter()
    look = functools.partial(
        takes_db.signal_first_look_if_empty,
        signal_id=signal["id"],
        fence=signal["check_fence"],
        lookback_seconds=NEAR_MISS_LOOKBACK.total_seconds(),
        counted=step.counts,
        next_check_at=step.next_check_at,
        next_check_reason=step.next_reason.value,
        batch_id=new_id("chk"),
    )
    if session is not None:
        written = look(session)
    else:
        with autocommit() as own:  # one statement: its own transaction
            written = look(own)
    if written:
        metrics.provider_call(signal["provider"], time.perf_counter() - began)
        metrics.check_recorded(signal["provider"], CheckOutcome.NO_MATCH.value)
    return written


def presumed_first_look(
    settings: Settings,
    values: Mapping[str, Any],
    *,
    provider_for: Any,
    breaker_for: Any,
    rng: random.Random | None = None,
) -> FirstLook | None:
    """The first look a new sink signal's create can make in its own
    statement (`signals_db.signal_create_if_clear`, `look`), for the values
    it inserts; None when the whole look must make it (the same cases as
    `first_look_if_empty`: another expectation, a first check later than the
    create, a provider that is not plain, a breaker with failures or open, a
    look that would end the signal). Raises what the breaker's Redis raised.

    The look's next step is decided here, before the create, on the
    counters the create inserts: a push provider's next look after one that
    found nothing is the deadline's, whenever the look is made."""
    if values["expect"] != Expect.FIRST or values["first_check_in"] != 0:
        return None
    now = datetime.now(UTC)
    deadline = now + timedelta(seconds=float(values["expires_in"]))
    new = {**values, "checks_count": 0, "consecutive_errors": 0, "expires_at": deadline}
    step = _quick_step(settings, new, now, provider_for, breaker_for, rng)
    if step is None or step.next_check_at != deadline:
        return None
    return FirstLook(
        counted=step.counts,
        next_reason=step.next_reason.value,
        lookback_seconds=NEAR_MISS_LOOKBACK.total_seconds(),
        batch_id=new_id("chk"),
    )


def _quick_step(
    settings: Settings,
    signal: Mapping[str, Any],
    now: datetime,
    provider_for: Any,
    breaker_for: Any,
    rng: random.Random | None,
) -> NextStep | None:
    """The next step of a first look of `signal` made at `now` that finds
    nothing, when one statement may make it; None when the whole look must:
    a provider that is not plain, a breaker with failures or open, a look
    that would end the signal."""
    name = signal["provider"]
    if not getattr(provider_for(name), "plain", False):
        return None
    # A breaker with failures counted (or open) is the whole look's to judge:
    # it records the outcome and resets the count. Only a read here.
    clean = getattr(breaker_for(name), "clean", None)
    if clean is None or not clean():
        return None
    step = next_step(
        settings,
        signal,
        CheckOutcome.NO_MATCH,
        reason=CheckReason.FIRST,
        looked_at=now,
        now=now,
        retry_after=None,
        rand=(rng or random).random(),
        pushes=True,
    )
    # A look that would end the signal: the whole look writes that.
    return step if step.expiry is None else None


def presumed_look_made(row: Mapping[str, Any]) -> bool:
    """Whether the create of `row` made its first look (the sink held no
    mail it could see), as `signal_create_if_clear` with `look` returned it."""
    return row.get("last_outcome") == CheckOutcome.NO_MATCH.value


def after_presumed_look(row: Mapping[str, Any], session: Connection, seconds: float) -> bool:
    """Once the create that made `row`'s first look committed (its
    statement took `seconds`): True when the sink now holds mail the look
    could have seen (stored after the create's snapshot, its push too early
    to see the signal), the signal made due for the whole look to find it;
    else nothing is written."""
    name = row["provider"]
    metrics.provider_call(name, seconds)
    metrics.check_recorded(name, CheckOutcome.NO_MATCH.value)
    return takes_db.signal_due_if_mail(
        session,
        row["id"],
        row["recipient"],
        fence=row["check_fence"],
        lookback_seconds=NEAR_MISS_LOOKBACK.total_seconds(),
    )


class FirstLooks:
    """The first looks a runner makes, one per provider at a time: a check
    takes every due signal of its provider, so a create that finds a look of
    its provider under way only asks it for one more round (its signal is
    committed, so that round takes it) instead of a look of its own. The
    round is made for the newest such signal: the one the round began with
    may be gone by then (expired and deleted), and a check finds its
    provider's batch through the signal it is made for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # provider -> the signal a create asked one more round for (None: none asked).
        self._again: dict[str, str | None] = {}

    def join(self, provider: str, signal_id: str) -> bool:
        """True when a look of `provider` is under way here and will take one
        more round, for `signal_id`."""
        with self._lock:
            if provider in self._again:
                self._again[provider] = signal_id
                return True
            self._again[provider] = None
            return False

    def done(self, provider: str) -> str | None:
        """The round ended: None when it was the last one, else the signal
        a create asked one more round for (which is then owed)."""
        with self._lock:
            again = self._again.get(provider)
            if again is not None:
                self._again[provider] = None
                return again
            self._again.pop(provider, None)
            return None

    def abandon(self, provider: str) -> None:
        with self._lock:
            self._again.pop(provider, None)
