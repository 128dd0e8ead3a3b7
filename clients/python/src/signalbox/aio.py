"""The asyncio client: the same API as :mod:`signalbox.client`, awaited.

>>> async with AsyncSignalbox() as sb:
...     handle = await sb.watch("ci-4711", "test_signup", "a@sink.test")
...     await handle.wait(timeout=60)
...     async with handle.claim() as claim:       # consumes on success
...         ...
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from signalbox import _core
from signalbox._core import Call
from signalbox.client import Listener, _claim_from, _dead_letter_page, _decode
from signalbox.errors import ServiceUnavailable, SignalboxError, SignalExpired, WaitTimeout
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


class AsyncSignalbox:
    """Asynchronous Signalbox API client; see :class:`signalbox.Signalbox`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = _core.DEFAULT_HTTP_TIMEOUT,
        retries: int = _core.DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = _core.resolve_url(url)
        self.token = _core.resolve_token(token)
        self.retries = retries
        headers = {"Accept": "application/json", "User-Agent": "signalbox-python"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        self.listeners: list[Listener] = []
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSignalbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call) -> tuple[int, Any]:
        attempts = 1 + (self.retries if call.retry else 0)
        for attempt in range(attempts):
            last = attempt + 1 >= attempts
            try:
                resp = await self._http.request(
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
                await self._sleep(_core.retry_delay(attempt))
                continue
            if resp.status_code >= 500 and not last:
                await self._sleep(_core.retry_delay(attempt))
                continue
            return _decode(resp, call)
        raise AssertionError("unreachable")  # pragma: no cover

    def _emit(self, event: str, obj: object) -> None:
        for listener in list(self.listeners):
            listener(event, obj)

    async def mailbox(self, run_id: str, provider: str = "sink") -> Mailbox:
        """Make a fresh, isolated address for ``run_id``."""
        return Mailbox.from_api((await self._send(_core.mailbox_call(run_id, provider)))[1])

    async def delete_mailbox(self, mailbox_id: str) -> None:
        await self._send(_core.mailbox_delete_call(mailbox_id))

    async def watch(
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
    ) -> AsyncSignalHandle:
        """Declare one expected email; see :meth:`signalbox.Signalbox.watch`."""
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
        status, body = await self._send(call)
        signal = Signal.from_api(body)
        self._emit("signal", signal)
        return AsyncSignalHandle(self, signal, created=status == 201)

    async def get_signal(self, signal_id: str, wait: int = 0) -> Signal:
        return Signal.from_api((await self._send(_core.signal_call(signal_id, wait)))[1])

    async def signal(self, signal_id: str) -> AsyncSignalHandle:
        return AsyncSignalHandle(self, await self.get_signal(signal_id))

    async def signals(self, run_id: str) -> list[Signal]:
        out: list[Signal] = []
        cursor: str | None = None
        while True:
            body = (await self._send(_core.signals_call(run_id, cursor)))[1]
            out.extend(Signal.from_api(i) for i in body.get("items", []))
            cursor = body.get("next_cursor")
            if not cursor:
                return out

    async def wait(
        self,
        signal_id: str,
        timeout: float = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        """See :meth:`signalbox.Signalbox.wait`."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            n = _core.long_poll_seconds(remaining) if remaining > 0 else 0
            started = time.monotonic()
            signal = await self.get_signal(signal_id, wait=n)
            if on_poll is not None:
                on_poll(signal)
            if signal.result == "expired":
                raise await self._expired(signal)
            if not signal.is_pending:
                return signal
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"signal {signal_id} still {signal.result} after {timeout:g}s",
                    signal=signal,
                )
            if time.monotonic() - started < n - 0.5:
                await self._sleep(min(signal.retry_after_seconds or 1.0, remaining))

    async def _expired(self, signal: Signal) -> SignalExpired:
        dead_letter = signal.dead_letter
        for _ in range(3):
            if dead_letter is not None:
                break
            await self._sleep(0.5)
            signal = await self.get_signal(signal.signal_id)
            dead_letter = signal.dead_letter
        if dead_letter is not None and not dead_letter.is_diagnosed and dead_letter.dead_letter_id:
            try:
                dead_letter = await self.dead_letter(dead_letter.dead_letter_id)
            except SignalboxError as exc:
                log.warning("could not fetch dead letter %s: %s", dead_letter.dead_letter_id, exc)
        return SignalExpired(
            f"signal {signal.signal_id} {_core.expired_message(dead_letter)}",
            code="expired",
            body=signal.raw,
            dead_letter=dead_letter,
            signal=signal,
        )

    def claim(self, signal_id: str, run_id: str, lease_seconds: int = 90) -> AsyncClaimLease:
        """Lease the message: ``await sb.claim(...)`` or ``async with sb.claim(...) as c``."""
        return AsyncClaimLease(self, signal_id, run_id, lease_seconds)

    async def _claim(self, signal_id: str, run_id: str, lease_seconds: int) -> Claim:
        status, body = await self._send(_core.claim_call(signal_id, run_id, lease_seconds))
        return _claim_from(status, body, signal_id)

    async def consume(self, claim_id: str) -> Receipt:
        receipt = Receipt.from_api((await self._send(_core.consume_call(claim_id)))[1])
        self._emit("receipt", receipt)
        return receipt

    async def release(self, claim_id: str) -> None:
        await self._send(_core.release_call(claim_id))

    async def extend(self, claim_id: str, lease_seconds: int = 90) -> datetime | None:
        body = (await self._send(_core.extend_call(claim_id, lease_seconds)))[1]
        return parse_time(body.get("lease_until")) if isinstance(body, Mapping) else None

    async def evidence(self, run_id: str) -> Evidence:
        return Evidence.from_api((await self._send(_core.evidence_call(run_id)))[1], run_id)

    async def dead_letters(
        self,
        state: str | None = "open",
        reason: str | None = None,
        provider: str | None = None,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[DeadLetter]:
        call = _core.dead_letters_call(state, reason, provider, cursor, limit)
        return _dead_letter_page((await self._send(call))[1])

    async def dead_letter(self, dead_letter_id: str) -> DeadLetter:
        return DeadLetter.from_api((await self._send(_core.dead_letter_call(dead_letter_id)))[1])

    async def redrive(
        self,
        dead_letter_id: str,
        expires_in_seconds: int | None = None,
        max_checks: int | None = None,
    ) -> AsyncSignalHandle:
        call = _core.redrive_call(dead_letter_id, expires_in_seconds, max_checks)
        return AsyncSignalHandle(self, Signal.from_api((await self._send(call))[1]))

    async def discard(self, dead_letter_id: str, note: str | None = None) -> DeadLetter | None:
        return DeadLetter.maybe((await self._send(_core.discard_call(dead_letter_id, note)))[1])


class AsyncSignalHandle:
    """A created signal, async flavour; see :class:`signalbox.SignalHandle`."""

    def __init__(self, client: AsyncSignalbox, signal: Signal, *, created: bool = False) -> None:
        self._client = client
        self.signal = signal
        self.created = created

    @property
    def signal_id(self) -> str:
        return self.signal.signal_id

    @property
    def run_id(self) -> str:
        return self.signal.run_id

    def __repr__(self) -> str:
        return f"AsyncSignalHandle({self.signal_id!r}, result={self.signal.result!r})"

    async def refresh(self) -> Signal:
        self.signal = await self._client.get_signal(self.signal_id)
        return self.signal

    async def wait(
        self,
        timeout: float = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        try:
            self.signal = await self._client.wait(self.signal_id, timeout, on_poll)
        except (SignalExpired, WaitTimeout) as exc:
            if exc.signal is not None:
                self.signal = exc.signal
            raise
        return self.signal

    def claim(self, lease_seconds: int = 90) -> AsyncClaimLease:
        return self._client.claim(self.signal_id, self.run_id, lease_seconds)


class AsyncClaimLease:
    """A claim request, then a held claim.

    ``await`` it to claim (returns itself, with ``claim`` set), or use
    ``async with`` to get the :class:`Claim`: a clean exit consumes (receipt in
    ``receipt``), an exception releases.
    """

    def __init__(
        self, client: AsyncSignalbox, signal_id: str, run_id: str, lease_seconds: int
    ) -> None:
        self._client = client
        self._request = (signal_id, run_id, lease_seconds)
        self._claim: Claim | None = None
        self.receipt: Receipt | None = None
        self._done = False

    @property
    def claim(self) -> Claim:
        if self._claim is None:
            raise RuntimeError("not claimed yet: await the lease or use `async with`")
        return self._claim

    @property
    def claim_id(self) -> str:
        return self.claim.claim_id

    async def acquire(self) -> AsyncClaimLease:
        if self._claim is None:
            self._claim = await self._client._claim(*self._request)
        return self

    def __await__(self) -> Generator[Any, None, AsyncClaimLease]:
        return self.acquire().__await__()

    async def consume(self) -> Receipt:
        self.receipt = await self._client.consume(self.claim_id)
        self._done = True
        return self.receipt

    async def release(self) -> None:
        await self._client.release(self.claim_id)
        self._done = True

    async def extend(self, lease_seconds: int = 90) -> datetime | None:
        return await self._client.extend(self.claim_id, lease_seconds)

    async def __aenter__(self) -> Claim:
        await self.acquire()
        return self.claim

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done:
            return
        if exc_type is None:
            await self.consume()
            return
        try:
            await self.release()
        except SignalboxError as release_error:
            log.warning("could not release claim %s: %s", self.claim_id, release_error)
