"""The sans-I/O client: settings, and every API operation as a generator of steps.

An operation (``Core._watch``, ``Core._wait``, ...) builds its requests with
:mod:`signalbox._requests` and reads the answers with
:mod:`signalbox._responses`. It never does I/O itself; it yields a step:

- a :class:`~signalbox._requests.Call`: the transport makes that HTTP request
  once and sends back what it received (a :class:`~signalbox._responses.Response`),
  or the exception it got instead when the service could not be reached;
- a :class:`Sleep`: the transport pauses, then sends back ``None``.

The operation's return value is the result. :class:`signalbox.Signalbox`
(httpx, blocking) and :class:`signalbox.AsyncSignalbox` (httpx, asyncio) are
``Core`` plus a loop that runs these steps, so retries, long polls and error
mapping are the same for both by construction.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from signalbox import _requests as rq
from signalbox._requests import Call
from signalbox._responses import Response, claim_from, dead_letter_page, decode, expired_message
from signalbox.errors import (
    EmailArrived,
    ServiceUnavailable,
    SignalboxError,
    SignalCancelled,
    SignalExpired,
    WaitTimeout,
    hide_client_frames,
)
from signalbox.models import (
    Claim,
    DeadLetter,
    Evidence,
    Mailbox,
    Match,
    Page,
    Receipt,
    Signal,
    matches_from,
    parse_time,
)

# pytest: a Signalbox error's traceback leaves this module's frames out.
__tracebackhide__ = hide_client_frames

DEFAULT_URL = "http://127.0.0.1:8040"
URL_ENV = "SIGNALBOX_URL"
TOKEN_ENV = "SIGNALBOX_TOKEN"

#: Default client-side wait: none. ``wait()`` lasts until the signal ends
#: (found, or expired with its diagnosis), however long its deadline is.
DEFAULT_WAIT_TIMEOUT: float | None = None
#: Without a client timeout, how long past the signal's deadline a still
#: pending view is trusted before the wait gives up (no worker expires it).
OVERDUE_GRACE_SECONDS = 120.0
DEFAULT_HTTP_TIMEOUT = 30.0
#: Retries after the first attempt, for calls where a retry is safe.
DEFAULT_RETRIES = 2
RETRY_BACKOFF = (0.25, 1.0, 2.0)

log = logging.getLogger("signalbox")

T = TypeVar("T")
C = TypeVar("C")

#: Called with ``("signal", Signal)`` when a signal is created and
#: ``("receipt", Receipt)`` when a claim is consumed (used by the pytest plugin).
Listener = Callable[[str, object], None]


@dataclass(frozen=True)
class Sleep:
    """A step: pause for ``seconds`` before the operation goes on."""

    seconds: float


#: What a transport sends back for a :class:`Call`: the answer, or why there was none.
Answer = Response | Exception
#: An operation: yields steps, is sent each step's answer (``Any``: an
#: :data:`Answer` after a call, ``None`` after a sleep), returns its result.
Operation = Generator[Call | Sleep, Any, T]


def resolve_url(url: str | None) -> str:
    """The API base URL: the argument, else ``$SIGNALBOX_URL``, else the default."""
    return (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def resolve_token(token: str | None) -> str | None:
    """The bearer token: the argument, else ``$SIGNALBOX_TOKEN`` (``None`` if neither)."""
    return token or os.environ.get(TOKEN_ENV) or None


def retry_delay(attempt: int) -> float:
    """Seconds to sleep before retry number ``attempt`` (0-based)."""
    return RETRY_BACKOFF[min(attempt, len(RETRY_BACKOFF) - 1)]


class Core:
    """What every client is before its transport: settings, listeners, operations."""

    def __init__(self, url: str | None, token: str | None, retries: int) -> None:
        self.url = resolve_url(url)
        self.token = resolve_token(token)
        self.retries = retries
        self.listeners: list[Listener] = []

    def _headers(self) -> dict[str, str]:
        """The headers every request carries."""
        headers = {"Accept": "application/json", "User-Agent": "signalbox-python"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _emit(self, event: str, obj: object) -> None:
        for listener in list(self.listeners):
            listener(event, obj)

    # --- one call -------------------------------------------------------------

    def _receive(self, call: Call) -> Operation[Response]:
        """The answer to ``call``, whatever its status; after a connection error or
        a 5xx it is repeated ``retries`` times, but only where repeating is harmless."""
        attempts = 1 + (self.retries if call.retry else 0)
        for attempt in range(attempts):
            last = attempt + 1 >= attempts
            answer: Answer = yield call
            if isinstance(answer, Exception):
                if last:
                    raise ServiceUnavailable(
                        f"cannot reach Signalbox at {self.url}: "
                        f"{answer.__class__.__name__}: {answer}"
                    ) from answer
                yield Sleep(retry_delay(attempt))
                continue
            if answer.status_code >= 500 and not last:
                yield Sleep(retry_delay(attempt))
                continue
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(self, call: Call) -> Operation[tuple[int, Any]]:
        """``call``'s status and decoded body, retried as :meth:`_receive` says;
        an error status raises the matching :class:`SignalboxError`."""
        return decode((yield from self._receive(call)), call)

    def _body(self, call: Call) -> Operation[Any]:
        """``call``'s decoded body (see :meth:`_send`)."""
        _, body = yield from self._send(call)
        return body

    # --- operations, one per client method ------------------------------------

    def _mailbox(self, run_id: str, provider: str) -> Operation[Mailbox]:
        return Mailbox.from_api((yield from self._body(rq.mailbox_call(run_id, provider))))

    def _delete_mailbox(self, mailbox_id: str) -> Operation[None]:
        yield from self._send(rq.mailbox_delete_call(mailbox_id))

    def _watch(self, call: Call) -> Operation[tuple[Signal, bool]]:
        """The signal ``call`` (a :func:`~signalbox._requests.watch_call`) declared,
        and whether it is new (201) rather than the existing one for its key."""
        status, body = yield from self._send(call)
        signal = Signal.from_api(body)
        self._emit("signal", signal)
        return signal, status == 201

    def _get_signal(self, signal_id: str, wait: int = 0) -> Operation[Signal]:
        return Signal.from_api((yield from self._body(rq.signal_call(signal_id, wait))))

    def _signals(self, run_id: str) -> Operation[list[Signal]]:
        out: list[Signal] = []
        cursor: str | None = None
        while True:
            body = yield from self._body(rq.signals_call(run_id, cursor))
            out.extend(Signal.from_api(i) for i in body.get("items", []))
            cursor = body.get("next_cursor")
            if not cursor:
                return out

    def _wait(
        self, signal_id: str, timeout: float | None, on_poll: Callable[[Signal], None] | None
    ) -> Operation[Signal]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = rq.SERVER_MAX_WAIT if deadline is None else deadline - time.monotonic()
            n = rq.long_poll_seconds(remaining) if remaining > 0 else 0
            started = time.monotonic()
            signal = yield from self._get_signal(signal_id, wait=n)
            if on_poll is not None:
                on_poll(signal)
            if signal.result == "expired":
                raise (yield from self._expired(signal))
            if signal.result == "arrived":
                raise EmailArrived(
                    f"signal {signal_id}: {signal.recommendation or 'an email arrived'}",
                    code="arrived",
                    body=signal.raw,
                    signal=signal,
                )
            if signal.result == "cancelled":
                reason = (signal.raw.get("cancellation") or {}).get("reason")
                raise SignalCancelled(
                    f"signal {signal_id} was cancelled ({reason})",
                    code="cancelled",
                    body=signal.raw,
                    signal=signal,
                    reason=reason,
                )
            if not signal.is_pending:
                return signal
            if deadline is None:
                _check_not_overdue(signal)
                remaining = float(rq.SERVER_MAX_WAIT)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(wait_timeout_message(signal, timeout), signal=signal)
            if time.monotonic() - started < n - 0.5:
                # The server answered early without a change: do not spin.
                yield Sleep(min(signal.retry_after_seconds or 1.0, remaining))

    def _expired(self, signal: Signal) -> Operation[SignalExpired]:
        dead_letter = signal.dead_letter
        # The dead letter is recorded just after expiry; give it a moment to appear.
        for _ in range(3):
            if dead_letter is not None:
                break
            yield Sleep(0.5)
            signal = yield from self._get_signal(signal.signal_id)
            dead_letter = signal.dead_letter
        if dead_letter is not None and not dead_letter.is_diagnosed and dead_letter.dead_letter_id:
            try:
                dead_letter = yield from self._dead_letter(dead_letter.dead_letter_id)
            except SignalboxError as exc:
                log.warning("could not fetch dead letter %s: %s", dead_letter.dead_letter_id, exc)
        return SignalExpired(
            f"signal {signal.signal_id} {expired_message(dead_letter)}",
            status=None,
            code="expired",
            body=signal.raw,
            dead_letter=dead_letter,
            signal=signal,
        )

    def _claim(
        self, signal_id: str, run_id: str, lease_seconds: int, owner: str | None = None
    ) -> Operation[Claim]:
        call = rq.claim_call(signal_id, run_id, lease_seconds, owner)
        status, body = yield from self._send(call)
        return claim_from(status, body, signal_id)

    def _matches(self, signal_id: str) -> Operation[list[Match]]:
        return matches_from((yield from self._body(rq.matches_call(signal_id))))

    def _cancel(self, signal_id: str, reason: str) -> Operation[Signal]:
        return Signal.from_api((yield from self._body(rq.cancel_call(signal_id, reason))))

    def _consume(self, claim_id: str) -> Operation[Receipt]:
        receipt = Receipt.from_api((yield from self._body(rq.consume_call(claim_id))))
        self._emit("receipt", receipt)
        return receipt

    def _release(self, claim_id: str) -> Operation[None]:
        yield from self._send(rq.release_call(claim_id))

    def _extend(self, claim_id: str, lease_seconds: int) -> Operation[datetime | None]:
        body = yield from self._body(rq.extend_call(claim_id, lease_seconds))
        return parse_time(body.get("lease_until")) if isinstance(body, Mapping) else None

    def _evidence(self, run_id: str) -> Operation[Evidence]:
        return Evidence.from_api((yield from self._body(rq.evidence_call(run_id))), run_id)

    def _dead_letters(
        self,
        state: str | None,
        reason: str | None,
        provider: str | None,
        cursor: str | None,
        limit: int | None,
        **filters: str | None,
    ) -> Operation[Page[DeadLetter]]:
        call = rq.dead_letters_call(state, reason, provider, cursor, limit, **filters)
        return dead_letter_page((yield from self._body(call)))

    def _dead_letters_bulk(self, action: str, body: dict[str, Any]) -> Operation[dict[str, Any]]:
        answer = yield from self._body(rq.dead_letters_bulk_call(action, body))
        return dict(answer) if isinstance(answer, Mapping) else {}

    def _dead_letter(self, dead_letter_id: str) -> Operation[DeadLetter]:
        return DeadLetter.from_api((yield from self._body(rq.dead_letter_call(dead_letter_id))))

    def _redrive(
        self, dead_letter_id: str, expires_in_seconds: int | None, max_checks: int | None
    ) -> Operation[Signal]:
        call = rq.redrive_call(dead_letter_id, expires_in_seconds, max_checks)
        return Signal.from_api((yield from self._body(call)))

    def _discard(self, dead_letter_id: str, note: str | None) -> Operation[DeadLetter | None]:
        return DeadLetter.maybe((yield from self._body(rq.discard_call(dead_letter_id, note))))


def wait_timeout_message(signal: Signal, timeout: float | None) -> str:
    """What a :class:`WaitTimeout` says: how long it waited and when the signal ends."""
    ends = (
        f"; the signal expires at {signal.expires_at.isoformat().replace('+00:00', 'Z')}"
        if signal.expires_at
        else ""
    )
    return (
        f"signal {signal.signal_id} still {signal.result} after {timeout:g}s{ends}"
        " (wait() without a timeout lasts until it ends, with the diagnosis if it expires)"
    )


def _check_not_overdue(signal: Signal) -> None:
    """Raise :class:`WaitTimeout` when a pending signal is long past its deadline:
    nothing is expiring it (no worker or beat running), so waiting on is forever."""
    if signal.expires_at is None:
        return
    overdue = time.time() - signal.expires_at.timestamp()
    if overdue > OVERDUE_GRACE_SECONDS:
        raise WaitTimeout(
            f"signal {signal.signal_id} still {signal.result} {overdue:.0f}s after its deadline"
            f" ({signal.expires_at.isoformat().replace('+00:00', 'Z')}): is a Signalbox worker"
            " running to expire it?",
            signal=signal,
        )


class HandleCore(Generic[C]):
    """What the sync and async signal handles share: the signal's last view."""

    def __init__(self, client: C, signal: Signal, *, created: bool = False) -> None:
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
        return f"{type(self).__name__}({self.signal_id!r}, result={self.signal.result!r})"

    def _keep_last_view(
        self, exc: SignalExpired | WaitTimeout | EmailArrived | SignalCancelled
    ) -> None:
        # A failed wait still saw the signal: keep that view for the caller.
        if exc.signal is not None:
            self.signal = exc.signal
