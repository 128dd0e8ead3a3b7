"""The asyncio client: the same API as :mod:`signalbox.client`, awaited.

>>> async with AsyncSignalbox() as sb:
...     handle = await sb.watch("ci-4711", "test_signup", "a@sink.test")
...     await handle.wait()
...     async with handle.claim() as claim:       # consumes on success
...         ...
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Generator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from signalbox import _core
from signalbox._core import Answer, HandleCore, Operation, Sleep
from signalbox._requests import Call, watch_call
from signalbox.client import http_request
from signalbox.errors import (
    EmailArrived,
    SignalboxError,
    SignalCancelled,
    SignalExpired,
    WaitTimeout,
    hide_client_frames,
)
from signalbox.message import AsyncBoundClaim, AsyncMessageMethods, Message, bind_async_claim
from signalbox.models import DeadLetter, Evidence, Mailbox, Match, Page, Receipt, Signal

# pytest: a Signalbox error's traceback leaves this module's frames out.
__tracebackhide__ = hide_client_frames

log = logging.getLogger("signalbox")

T = TypeVar("T")


class AsyncSignalbox(_core.Core, AsyncMessageMethods):
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
        super().__init__(url, token, retries)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=self._headers(), timeout=timeout, transport=transport
        )
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSignalbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, operation: Operation[T]) -> T:
        """Run a core operation: make its calls over HTTP, sleep its pauses."""
        answer: Any = None
        while True:
            try:
                step = operation.send(answer)
            except StopIteration as done:
                return done.value
            if isinstance(step, Sleep):
                await self._sleep(step.seconds)
                answer = None
            else:
                answer = await self._answer(step)

    async def _answer(self, call: Call) -> Answer:
        try:
            return await self._http.send(http_request(self._http, call))
        except httpx.TransportError as exc:
            return exc

    async def mailbox(self, run_id: str, provider: str = "sink") -> Mailbox:
        """Make a fresh, isolated address for ``run_id``."""
        return await self._run(self._mailbox(run_id, provider))

    async def delete_mailbox(self, mailbox_id: str) -> None:
        await self._run(self._delete_mailbox(mailbox_id))

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
        expect: str | None = None,
        settle_seconds: int | None = None,
    ) -> AsyncSignalHandle:
        """Declare one expected email; see :meth:`signalbox.Signalbox.watch`."""
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
        signal, created = await self._run(self._watch(call))
        return AsyncSignalHandle(self, signal, created=created)

    async def expect_none(
        self, run_id: str, test_case: str, recipient: str, **filters: Any
    ) -> AsyncSignalHandle:
        """See :meth:`signalbox.Signalbox.expect_none`."""
        return await self.watch(run_id, test_case, recipient, expect="none", **filters)

    async def expect_exactly_one(
        self,
        run_id: str,
        test_case: str,
        recipient: str,
        settle_seconds: int | None = None,
        **filters: Any,
    ) -> AsyncSignalHandle:
        """See :meth:`signalbox.Signalbox.expect_exactly_one`."""
        return await self.watch(
            run_id,
            test_case,
            recipient,
            expect="exactly_one",
            settle_seconds=settle_seconds,
            **filters,
        )

    async def matches(self, signal_id: str) -> list[Match]:
        """See :meth:`signalbox.Signalbox.matches`."""
        return await self._run(self._matches(signal_id))

    async def cancel(self, signal_id: str, reason: str = "cancelled") -> Signal:
        """See :meth:`signalbox.Signalbox.cancel`."""
        return await self._run(self._cancel(signal_id, reason))

    async def get_signal(self, signal_id: str, wait: int = 0) -> Signal:
        return await self._run(self._get_signal(signal_id, wait))

    async def signal(self, signal_id: str) -> AsyncSignalHandle:
        return AsyncSignalHandle(self, await self.get_signal(signal_id))

    async def signals(self, run_id: str) -> list[Signal]:
        return await self._run(self._signals(run_id))

    async def wait(
        self,
        signal_id: str,
        timeout: float | None = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        """See :meth:`signalbox.Signalbox.wait`."""
        return await self._run(self._wait(signal_id, timeout, on_poll))

    def claim(
        self, signal_id: str, run_id: str, lease_seconds: int = 90, owner: str | None = None
    ) -> AsyncClaimLease:
        """Lease the message: ``await sb.claim(...)`` or ``async with sb.claim(...) as c``."""
        return AsyncClaimLease(self, signal_id, run_id, lease_seconds, owner)

    async def consume(self, claim_id: str) -> Receipt:
        return await self._run(self._consume(claim_id))

    async def release(self, claim_id: str) -> None:
        await self._run(self._release(claim_id))

    async def extend(self, claim_id: str, lease_seconds: int = 90) -> datetime | None:
        return await self._run(self._extend(claim_id, lease_seconds))

    async def evidence(self, run_id: str) -> Evidence:
        return await self._run(self._evidence(run_id))

    async def dead_letters(
        self,
        state: str | None = "open",
        reason: str | None = None,
        provider: str | None = None,
        *,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page[DeadLetter]:
        return await self._run(self._dead_letters(state, reason, provider, cursor, limit))

    async def dead_letter(self, dead_letter_id: str) -> DeadLetter:
        return await self._run(self._dead_letter(dead_letter_id))

    async def redrive(
        self,
        dead_letter_id: str,
        expires_in_seconds: int | None = None,
        max_checks: int | None = None,
    ) -> AsyncSignalHandle:
        signal = await self._run(self._redrive(dead_letter_id, expires_in_seconds, max_checks))
        return AsyncSignalHandle(self, signal)

    async def discard(self, dead_letter_id: str, note: str | None = None) -> DeadLetter | None:
        return await self._run(self._discard(dead_letter_id, note))


class AsyncSignalHandle(HandleCore["AsyncSignalbox"]):
    """A created signal, async flavour; see :class:`signalbox.SignalHandle`."""

    async def refresh(self) -> Signal:
        self.signal = await self._client.get_signal(self.signal_id)
        return self.signal

    async def wait(
        self,
        timeout: float | None = _core.DEFAULT_WAIT_TIMEOUT,
        on_poll: Callable[[Signal], None] | None = None,
    ) -> Signal:
        try:
            self.signal = await self._client.wait(self.signal_id, timeout, on_poll)
        except (SignalExpired, WaitTimeout, EmailArrived, SignalCancelled) as exc:
            self._keep_last_view(exc)
            raise
        return self.signal

    def claim(self, lease_seconds: int = 90, owner: str | None = None) -> AsyncClaimLease:
        return self._client.claim(self.signal_id, self.run_id, lease_seconds, owner)

    async def matches(self) -> list[Match]:
        return await self._client.matches(self.signal_id)

    async def cancel(self, reason: str = "cancelled") -> Signal:
        self.signal = await self._client.cancel(self.signal_id, reason)
        return self.signal


class AsyncClaimLease:
    """A claim request, then a held claim.

    ``await`` it to claim (returns itself, with ``claim`` set), or use
    ``async with`` to get the :class:`Claim`: a clean exit consumes (receipt in
    ``receipt``), an exception releases.
    """

    def __init__(
        self,
        client: AsyncSignalbox,
        signal_id: str,
        run_id: str,
        lease_seconds: int,
        owner: str | None = None,
    ) -> None:
        self._client = client
        self._request = (signal_id, run_id, lease_seconds, owner)
        self._claim: AsyncBoundClaim | None = None
        self.receipt: Receipt | None = None
        self._done = False

    @property
    def claim(self) -> AsyncBoundClaim:
        if self._claim is None:
            raise RuntimeError("not claimed yet: await the lease or use `async with`")
        return self._claim

    @property
    def claim_id(self) -> str:
        return self.claim.claim_id

    async def acquire(self) -> AsyncClaimLease:
        if self._claim is None:
            claim = await self._client._run(self._client._claim(*self._request))
            self._claim = bind_async_claim(claim, self._client)
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

    async def __aenter__(self) -> AsyncBoundClaim:
        await self.acquire()
        return self.claim

    async def message(self) -> Message:
        """The whole message of this claim (see :mod:`signalbox.message`)."""
        return await self._client.message(self.claim_id)

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
