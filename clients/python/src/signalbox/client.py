"""The synchronous client.

>>> sb = Signalbox()                                  # SIGNALBOX_URL / SIGNALBOX_TOKEN
>>> box = sb.mailbox("ci-4711")
>>> handle = sb.watch("ci-4711", "test_signup", box.address, subject_contains="Verify")
>>> # ... make the application send the email ...
>>> handle.wait(timeout=60)                           # raises SignalExpired / WaitTimeout
>>> with handle.claim() as claim:                     # consumes on success, releases on error
...     follow(claim.links[0])
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from signalbox import _core
from signalbox._core import Call
from signalbox.errors import (
    ServiceUnavailable,
    SignalboxError,
    SignalExpired,
    SignalNotReady,
    WaitTimeout,
)
from signalbox.models import (
    Claim,
    DeadLetter,
    Evidence,
    Mailbox,
    Page,
    Receipt,
    Signal,
    parse_time,
)

log = logging.getLogger("signalbox")

#: Called with ``("signal", Signal)`` when a signal is created and
#: ``("receipt", Receipt)`` when a claim is consumed (used by the pytest plugin).
Listener = Callable[[str, object], None]


class Signalbox:
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
        self.url = _core.resolve_url(url)
        self.token = _core.resolve_token(token)
        self.retries = retries
        headers = {"Accept": "application/json", "User-Agent": "signalbox-python"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        self.listeners: list[Listener] = []
        self._sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Signalbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport -----------------------------------------------------------

    def _send(self, call: Call) -> tuple[int, Any]:
        attempts = 1 + (self.retries if call.retry else 0)
        for attempt in range(attempts):
            last = attempt + 1 >= attempts
            try:
                resp = self._http.request(
                    call.method,
                    call.path,
                    json=call.json,
                    params=dict(call.params),
                    headers=dict(call.headers),
                    timeout=call.timeout if call.timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                if last:
                    raise ServiceUnavailable(
                        f"cannot reach Signalbox at {self.url}: {exc.__class__.__name__}: {exc}"
                    ) from exc
                self._sleep(_core.retry_delay(attempt))
                continue
            if resp.status_code >= 500 and not last:
                self._sleep(_core.retry_delay(attempt))
                continue
            return _decode(resp, call)
        raise AssertionError("unreachable")  # pragma: no cover

    def _emit(self, event: str, obj: object) -> None:
        for listener in list(self.listeners):
            listener(event, obj)

    # --- mailboxes -------------------------------------------------------------

    def mailbox(self, run_id: str, provider: str = "sink") -> Mailbox:
        """Make a fresh, isolated address for ``run_id`` (no earlier message can match it)."""
        return Mailbox.from_api(self._send(_core.mailbox_call(run_id, provider))[1])

    def delete_mailbox(self, mailbox_id: str) -> None:
        """Purge a mailbox's messages (receipts and evidence stay)."""
        self._send(_core.mailbox_delete_call(mailbox_id))

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
    ) -> SignalHandle:
        """Declare one expected email for ``run_id`` and return a handle to wait on.

        Idempotent: the same key (``idempotency_key``, else ``run_id:test_case``)
        returns the existing signal; with different filters it raises
        :class:`~signalbox.errors.IdempotencyConflict`.
        """
        call = _core.watch_call(
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
        )
        status, body = self._send(call)
        signal = Signal.from_api(body)
        self._emit("signal", signal)
        return SignalHandle(self, signal, created=status == 201)

    def get_signal(self, signal_id: str, wait: int = 0) -> Signal:
        """The signal's current view; with ``wait`` (≤ 60) a long poll."""
        return Signal.from_api(self._send(_core.signal_call(signal_id, wait))[1])

    def signal(self, signal_id: str) -> SignalHandle:
        """A handle on an existing signal (one GET)."""
        return SignalHandle(self, self.get_signal(signal_id))

    def signals(self, run_id: str) -> list[Signal]:
        """Every signal of a run (all pages)."""
        out: list[Signal] = []
        cursor: str | None = None
        while True:
            body = self._send(_core.signals_call(run_id, cursor))[1]
            out.extend(Signal.from_api(i) for i in body.get("items", []))
            cursor = body.get("next_cursor")
            if not cursor:
                return out

    def wait(
        self,
        signal_id: str,
        timeout: float = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        """Block until the signal leaves ``waiting``/``provider_error`` or ``timeout`` passes.

        Resumes the server's long poll (≤ 60 s per request) until ``timeout``.
        Returns the signal once ``found`` (or ``claimed``/``consumed``); raises
        :class:`SignalExpired` with the dead letter's diagnosis if it expired,
        :class:`WaitTimeout` if the client's timeout passed first.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            n = _core.long_poll_seconds(remaining) if remaining > 0 else 0
            started = time.monotonic()
            signal = self.get_signal(signal_id, wait=n)
            if on_poll is not None:
                on_poll(signal)
            if signal.result == "expired":
                raise self._expired(signal)
            if not signal.is_pending:
                return signal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"signal {signal_id} still {signal.result} after {timeout:g}s",
                    signal=signal,
                )
            if time.monotonic() - started < n - 0.5:
                # The server answered early without a change: do not spin.
                self._sleep(min(signal.retry_after_seconds or 1.0, remaining))

    def _expired(self, signal: Signal) -> SignalExpired:
        dead_letter = signal.dead_letter
        # The dead letter is recorded just after expiry; give it a moment to appear.
        for _ in range(3):
            if dead_letter is not None:
                break
            self._sleep(0.5)
            signal = self.get_signal(signal.signal_id)
            dead_letter = signal.dead_letter
        if dead_letter is not None and not dead_letter.is_diagnosed and dead_letter.dead_letter_id:
            try:
                dead_letter = self.dead_letter(dead_letter.dead_letter_id)
            except SignalboxError as exc:
                log.warning("could not fetch dead letter %s: %s", dead_letter.dead_letter_id, exc)
        return SignalExpired(
            f"signal {signal.signal_id} {_core.expired_message(dead_letter)}",
            status=None,
            code="expired",
            body=signal.raw,
            dead_letter=dead_letter,
            signal=signal,
        )

    # --- claims ---------------------------------------------------------------

    def claim(self, signal_id: str, run_id: str, lease_seconds: int = 90) -> ClaimLease:
        """Lease the signal's message; raises ``AlreadyClaimed``, ``AlreadyConsumed``,
        ``RunMismatch``, ``SignalNotReady`` (no match yet) or ``SignalExpired``.

        The returned lease is a context manager yielding the :class:`Claim`:
        it consumes on a clean exit and releases on an exception.
        """
        status, body = self._send(_core.claim_call(signal_id, run_id, lease_seconds))
        return ClaimLease(self, _claim_from(status, body, signal_id))

    def consume(self, claim_id: str) -> Receipt:
        """Consume a claim for its receipt (repeating returns the same receipt).

        Raises :class:`LeaseExpired` when the lease lapsed first.
        """
        receipt = Receipt.from_api(self._send(_core.consume_call(claim_id))[1])
        self._emit("receipt", receipt)
        return receipt

    def release(self, claim_id: str) -> None:
        """Give the message back: the signal is ``found`` again."""
        self._send(_core.release_call(claim_id))

    def extend(self, claim_id: str, lease_seconds: int = 90) -> datetime | None:
        """Extend a lease; returns the new ``lease_until``."""
        body = self._send(_core.extend_call(claim_id, lease_seconds))[1]
        return parse_time(body.get("lease_until")) if isinstance(body, Mapping) else None

    # --- evidence and dead letters ------------------------------------------

    def evidence(self, run_id: str) -> Evidence:
        """The run's evidence artifact (no body, link, code or token in it)."""
        return Evidence.from_api(self._send(_core.evidence_call(run_id))[1], run_id)

    def dead_letters(
        self,
        state: str | None = "open",
        reason: str | None = None,
        provider: str | None = None,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[DeadLetter]:
        """One page of dead letters, filtered by state, reason and provider."""
        body = self._send(_core.dead_letters_call(state, reason, provider, cursor, limit))[1]
        return _dead_letter_page(body)

    def dead_letter(self, dead_letter_id: str) -> DeadLetter:
        """One dead letter with its diagnosis."""
        return DeadLetter.from_api(self._send(_core.dead_letter_call(dead_letter_id))[1])

    def redrive(
        self,
        dead_letter_id: str,
        expires_in_seconds: int | None = None,
        max_checks: int | None = None,
    ) -> SignalHandle:
        """Send a dead letter's signal back to ``waiting`` with a new deadline and budget."""
        body = self._send(_core.redrive_call(dead_letter_id, expires_in_seconds, max_checks))[1]
        return SignalHandle(self, Signal.from_api(body))

    def discard(self, dead_letter_id: str, note: str | None = None) -> DeadLetter | None:
        """Close a dead letter without redriving it."""
        body = self._send(_core.discard_call(dead_letter_id, note))[1]
        return DeadLetter.maybe(body)


def _decode(resp: httpx.Response, call: Call) -> tuple[int, Any]:
    body: Any = None
    if resp.content:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
    if resp.status_code >= 400:
        raise _core.error_for(resp.status_code, body, f"{call.method} {call.path}")
    return resp.status_code, body


def _claim_from(status: int, body: Any, signal_id: str) -> Claim:
    data = body if isinstance(body, Mapping) else {}
    if status == 202 or data.get("status") == "waiting":
        retry = data.get("retry_after_seconds")
        raise SignalNotReady(
            f"signal {signal_id} has no matching message yet",
            status=status,
            code="waiting",
            body=body,
            retry_after_seconds=float(retry) if isinstance(retry, int | float) else None,
        )
    return Claim.from_api(data, signal_id)


def _dead_letter_page(body: Any) -> Page[DeadLetter]:
    data = body if isinstance(body, Mapping) else {}
    return Page(
        items=tuple(
            DeadLetter.from_api(i) for i in data.get("items", []) if isinstance(i, Mapping)
        ),
        next_cursor=data.get("next_cursor"),
    )


class SignalHandle:
    """A created signal: ``wait()`` for it, then ``claim()`` its message."""

    def __init__(self, client: Signalbox, signal: Signal, *, created: bool = False) -> None:
        self._client = client
        self.signal = signal
        #: True when this call created the signal (201), False when it already existed.
        self.created = created

    @property
    def signal_id(self) -> str:
        return self.signal.signal_id

    @property
    def run_id(self) -> str:
        return self.signal.run_id

    def __repr__(self) -> str:
        return f"SignalHandle({self.signal_id!r}, result={self.signal.result!r})"

    def refresh(self) -> Signal:
        """Fetch the current view."""
        self.signal = self._client.get_signal(self.signal_id)
        return self.signal

    def wait(
        self,
        timeout: float = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        """See :meth:`Signalbox.wait`."""
        try:
            self.signal = self._client.wait(self.signal_id, timeout, on_poll)
        except (SignalExpired, WaitTimeout) as exc:
            if exc.signal is not None:
                self.signal = exc.signal
            raise
        return self.signal

    def claim(self, lease_seconds: int = 90) -> ClaimLease:
        """Lease the message; use as ``with handle.claim() as claim: ...``."""
        return self._client.claim(self.signal_id, self.run_id, lease_seconds)


class ClaimLease:
    """A held claim. As a context manager it yields the :class:`Claim`, consumes on
    a clean exit (the receipt is then in ``receipt``) and releases on an exception.
    """

    def __init__(self, client: Signalbox, claim: Claim) -> None:
        self._client = client
        self.claim = claim
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

    def __enter__(self) -> Claim:
        return self.claim

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
