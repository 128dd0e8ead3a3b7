"""The synchronous client.

>>> sb = Signalbox()                                  # SIGNALBOX_URL / SIGNALBOX_TOKEN
>>> box = sb.mailbox("ci-4711")
>>> handle = sb.watch("ci-4711", "test_signup", box.address, subject_contains="Verify")
>>> # ... make the application send the email ...
>>> handle.wait()                                     # until found; else SignalExpired
>>> with handle.claim() as claim:                     # consumes on success, releases on error
...     follow(claim.links[0])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from signalbox import _core
from signalbox._core import Answer, HandleCore, Operation, Sleep
from signalbox._requests import Call, watch_call
from signalbox.errors import (
    EmailArrived,
    SignalboxError,
    SignalCancelled,
    SignalExpired,
    WaitTimeout,
    hide_client_frames,
)
from signalbox.message import BoundClaim, Message, MessageMethods, bind_claim
from signalbox.models import Claim, DeadLetter, Evidence, Mailbox, Match, Page, Receipt, Signal

# pytest: a Signalbox error's traceback leaves this module's frames out.
__tracebackhide__ = hide_client_frames

log = logging.getLogger("signalbox")

T = TypeVar("T")


class Signalbox(_core.Core, MessageMethods):
    """Synchronous Signalbox API client.

    ``url`` and ``token`` fall back to ``SIGNALBOX_URL`` / ``SIGNALBOX_TOKEN``
    (default URL ``http://127.0.0.1:8040``). Connection errors and 5xx answers
    are retried only where repeating is harmless: GETs, signal creation
    (idempotent by key) and consume — never claim.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = _core.DEFAULT_HTTP_TIMEOUT,
        retries: int = _core.DEFAULT_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, retries)
        self._http = httpx.Client(
            base_url=self.url, headers=self._headers(), timeout=timeout, transport=transport
        )
        self._sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Signalbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport -----------------------------------------------------------

    def _run(self, operation: Operation[T]) -> T:
        """Run a core operation: make its calls over HTTP, sleep its pauses."""
        answer: Any = None
        while True:
            try:
                step = operation.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(step, Sleep):
                self._sleep(step.seconds)
                answer = None
            else:
                answer = self._answer(step)

    def _answer(self, call: Call) -> Answer:
        try:
            return self._http.send(http_request(self._http, call))
        except httpx.TransportError as exc:
            return exc

    # --- mailboxes -------------------------------------------------------------

    def mailbox(self, run_id: str, provider: str = "sink") -> Mailbox:
        """Make a fresh, isolated address for ``run_id`` (no earlier message can match it)."""
        return self._run(self._mailbox(run_id, provider))

    def delete_mailbox(self, mailbox_id: str) -> None:
        """Purge a mailbox's messages (receipts and evidence stay)."""
        self._run(self._delete_mailbox(mailbox_id))

    # --- signals ---------------------------------------------------------------

    def watch(
        self,
        run_id: str,
        test_case: str,
        recipient: str,
        subject_contains: str | None = None,
        body_contains: str | None = None,
        expires_in_seconds: int | None = None,
        max_checks: int | None = None,
        provider: str | None = None,
        require_run_marker: bool = False,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        expect: str | None = None,
        settle_seconds: int | None = None,
    ) -> SignalHandle:
        """Declare one expected email for ``run_id`` and return a handle to wait on.

        Idempotent: the same key (``idempotency_key``, else ``run_id:test_case``)
        returns the existing signal; with different filters it raises
        :class:`~signalbox.errors.IdempotencyConflict`.

        ``expect`` is ``"first"`` (the default), ``"exactly_one"`` (with
        ``settle_seconds``) or ``"none"``; see :meth:`expect_none` and
        :meth:`expect_exactly_one`.
        """
        call = watch_call(
            run_id=run_id,
            test_case=test_case,
            recipient=recipient,
            subject_contains=subject_contains,
            body_contains=body_contains,
            expires_in_seconds=expires_in_seconds,
            max_checks=max_checks,
            provider=provider,
            require_run_marker=require_run_marker,
            metadata=metadata,
            idempotency_key=idempotency_key,
            expect=expect,
            settle_seconds=settle_seconds,
        )
        signal, created = self._run(self._watch(call))
        return SignalHandle(self, signal, created=created)

    def expect_none(
        self, run_id: str, test_case: str, recipient: str, **filters: Any
    ) -> SignalHandle:
        """Assert that no matching email arrives before the deadline
        (``expires_in_seconds``, default 120): ``handle.wait()`` returns the
        ``absent`` signal once a look at or after the deadline found none, and
        raises :class:`~signalbox.errors.EmailArrived` as soon as one comes.
        ``filters`` are :meth:`watch`'s keywords."""
        return self.watch(run_id, test_case, recipient, expect="none", **filters)

    def expect_exactly_one(
        self,
        run_id: str,
        test_case: str,
        recipient: str,
        settle_seconds: int | None = None,
        **filters: Any,
    ) -> SignalHandle:
        """Assert that exactly one matching email arrives: ``handle.wait()``
        returns the ``found`` signal once no second one came within
        ``settle_seconds`` (default 5) after it, and raises
        :class:`~signalbox.errors.SignalExpired` with reason
        ``duplicate_messages`` (``exc.dead_letter.duplicates``) when one did."""
        return self.watch(
            run_id,
            test_case,
            recipient,
            expect="exactly_one",
            settle_seconds=settle_seconds,
            **filters,
        )

    def matches(self, signal_id: str) -> list[Match]:
        """Every message matching the signal's filters in its window, oldest
        first, with the signal that took each."""
        return self._run(self._matches(signal_id))

    def cancel(self, signal_id: str, reason: str = "cancelled") -> Signal:
        """End a signal its test no longer waits for: ``cancelled`` (final, no
        dead letter; an active claim ends). Again → the same view; a signal
        that ended otherwise raises :class:`NotCancellable`."""
        return self._run(self._cancel(signal_id, reason))

    def get_signal(self, signal_id: str, wait: int = 0) -> Signal:
        """The signal's current view; with ``wait`` (≤ 60) a long poll."""
        return self._run(self._get_signal(signal_id, wait))

    def signal(self, signal_id: str) -> SignalHandle:
        """A handle on an existing signal (one GET)."""
        return SignalHandle(self, self.get_signal(signal_id))

    def signals(self, run_id: str) -> list[Signal]:
        """Every signal of a run (all pages)."""
        return self._run(self._signals(run_id))

    def wait(
        self,
        signal_id: str,
        timeout: float | None = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        """Block until the signal leaves ``waiting``/``provider_error``.

        Resumes the server's long poll (≤ 60 s per request). Returns the signal
        once ``found`` (or ``claimed``/``consumed``); raises
        :class:`SignalExpired` with the dead letter's diagnosis if it expired.
        Without ``timeout`` (the default) the wait lasts until the signal ends,
        so an expiry always comes with its diagnosis; with a shorter
        ``timeout``, :class:`WaitTimeout` carries the last view (``signal``)
        and when the signal will expire (``expires_at``).
        """
        return self._run(self._wait(signal_id, timeout, on_poll))

    # --- claims ---------------------------------------------------------------

    def claim(
        self, signal_id: str, run_id: str, lease_seconds: int = 90, owner: str | None = None
    ) -> ClaimLease:
        """Lease the signal's message to ``owner`` (default: the token's name);
        raises ``AlreadyClaimed`` (with the holder's ``owner``), ``AlreadyConsumed``,
        ``RunMismatch``, ``NotClaimable`` (``expect="none"``), ``SignalNotReady``
        (no match yet) or ``SignalExpired``.

        The returned lease is a context manager yielding the :class:`Claim`:
        it consumes on a clean exit and releases on an exception.
        """
        return ClaimLease(self, self._run(self._claim(signal_id, run_id, lease_seconds, owner)))

    def consume(self, claim_id: str) -> Receipt:
        """Consume a claim for its receipt (repeating returns the same receipt).

        Raises :class:`LeaseExpired` when the lease lapsed first.
        """
        return self._run(self._consume(claim_id))

    def release(self, claim_id: str) -> None:
        """Give the message back: the signal is ``found`` again."""
        self._run(self._release(claim_id))

    def extend(self, claim_id: str, lease_seconds: int = 90) -> datetime | None:
        """Extend a lease; returns the new ``lease_until``."""
        return self._run(self._extend(claim_id, lease_seconds))

    # --- evidence and dead letters ------------------------------------------

    def evidence(self, run_id: str) -> Evidence:
        """The run's evidence artifact (no body, link, code or token in it)."""
        return self._run(self._evidence(run_id))

    def dead_letters(
        self,
        state: str | None = "open",
        reason: str | None = None,
        provider: str | None = None,
        *,
        cursor: str | None = None,
        limit: int | None = None,
        run_id: str | None = None,
        test_case: str | None = None,
        why: str | None = None,
    ) -> Page[DeadLetter]:
        """One page of dead letters, filtered by state, reason, provider, run and
        test case (each item's ``raw`` also has ``test_case`` and ``why``)."""
        return self._run(
            self._dead_letters(
                state, reason, provider, cursor, limit, run_id=run_id, test_case=test_case, why=why
            )
        )

    def redrive_many(
        self,
        filter: dict[str, str],
        *,
        limit: int = 50,
        expires_in_seconds: int | None = None,
        max_checks: int | None = None,
    ) -> dict[str, Any]:
        """Redrive up to ``limit`` open dead letters matching ``filter`` (``run_id``,
        ``test_case``, ``reason``, ``provider``, ``why``): ``{"dead_letter_ids", "count"}``."""
        body = {
            "filter": filter,
            "limit": limit,
            "expires_in_seconds": expires_in_seconds,
            "max_checks": max_checks,
        }
        return self._run(self._dead_letters_bulk("redrive", body))

    def discard_many(self, filter: dict[str, str], note: str, *, limit: int = 50) -> dict[str, Any]:
        """Discard up to ``limit`` open dead letters matching ``filter``, with ``note``."""
        body = {"filter": filter, "limit": limit, "note": note}
        return self._run(self._dead_letters_bulk("discard", body))

    def dead_letter(self, dead_letter_id: str) -> DeadLetter:
        """One dead letter with its diagnosis."""
        return self._run(self._dead_letter(dead_letter_id))

    def redrive(
        self,
        dead_letter_id: str,
        expires_in_seconds: int | None = None,
        max_checks: int | None = None,
    ) -> SignalHandle:
        """Send a dead letter's signal back to ``waiting`` with a new deadline and budget."""
        signal = self._run(self._redrive(dead_letter_id, expires_in_seconds, max_checks))
        return SignalHandle(self, signal)

    def discard(self, dead_letter_id: str, note: str | None = None) -> DeadLetter | None:
        """Close a dead letter without redriving it."""
        return self._run(self._discard(dead_letter_id, note))


def http_request(http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
    """The httpx request for ``call`` (both clients send theirs through this)."""
    return http.build_request(
        call.method,
        call.path,
        json=call.json,
        params=dict(call.params),
        headers=dict(call.headers),
        timeout=call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT,
    )


class SignalHandle(HandleCore["Signalbox"]):
    """A created signal: ``wait()`` for it, then ``claim()`` its message."""

    def refresh(self) -> Signal:
        """Fetch the current view."""
        self.signal = self._client.get_signal(self.signal_id)
        return self.signal

    def wait(
        self,
        timeout: float | None = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        """See :meth:`Signalbox.wait`."""
        try:
            self.signal = self._client.wait(self.signal_id, timeout, on_poll)
        except (SignalExpired, WaitTimeout, EmailArrived, SignalCancelled) as exc:
            self._keep_last_view(exc)
            raise
        return self.signal

    def claim(self, lease_seconds: int = 90, owner: str | None = None) -> ClaimLease:
        """Lease the message; use as ``with handle.claim() as claim: ...``."""
        return self._client.claim(self.signal_id, self.run_id, lease_seconds, owner)

    def matches(self) -> list[Match]:
        """See :meth:`Signalbox.matches`."""
        return self._client.matches(self.signal_id)

    def cancel(self, reason: str = "cancelled") -> Signal:
        """See :meth:`Signalbox.cancel`."""
        self.signal = self._client.cancel(self.signal_id, reason)
        return self.signal


class ClaimLease:
    """A held claim. As a context manager it yields the :class:`Claim`, consumes on
    a clean exit (the receipt is then in ``receipt``) and releases on an exception.
    """

    def __init__(self, client: Signalbox, claim: Claim) -> None:
        self._client = client
        #: The claim; ``claim.message()`` reads the whole message.
        self.claim: BoundClaim = bind_claim(claim, client)
        self.receipt: Receipt | None = None
        self._done = False

    @property
    def claim_id(self) -> str:
        return self.claim.claim_id

    def __repr__(self) -> str:
        return f"ClaimLease({self.claim_id!r}, lease_until={self.claim.lease_until!r})"

    def consume(self) -> Receipt:
        self.receipt = self._client.consume(self.claim_id)
        self._done = True
        return self.receipt

    def release(self) -> None:
        self._client.release(self.claim_id)
        self._done = True

    def extend(self, lease_seconds: int = 90) -> datetime | None:
        return self._client.extend(self.claim_id, lease_seconds)

    def __enter__(self) -> BoundClaim:
        return self.claim

    def message(self) -> Message:
        """The whole message of this claim (see :mod:`signalbox.message`)."""
        return self._client.message(self.claim_id)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done:
            return
        if exc_type is None:
            self.consume()
            return
        try:
            self.release()
        except SignalboxError as release_error:
            # The original exception matters more; the lease lapses on its own anyway.
            log.warning("could not release claim %s: %s", self.claim_id, release_error)
