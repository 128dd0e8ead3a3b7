"""The guarded provider call: build the provider, ask it through its circuit
breaker (and, for a polled provider, a bulkhead slot); every failure is an
outcome, never an exception."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.domain.states import CheckOutcome
from app.errors import ProviderError
from app.observability import metrics
from app.providers.base import Provider, ProviderMessage, SearchQuery
from app.usecases.checks.heartbeat import LeaseKeeper

log = logging.getLogger("signalbox.checks")


class Admission(Protocol):
    @property
    def allowed(self) -> bool: ...
    @property
    def probe(self) -> bool: ...
    @property
    def retry_at(self) -> float | None: ...
    @property
    def clean(self) -> bool: ...


class Breaker(Protocol):
    def before_call(self) -> Admission: ...
    def record_success(self) -> None: ...
    def record_failure(self, retry_after: float | None = None) -> None: ...


@dataclass(frozen=True)
class ProviderAnswer:
    """What the provider call produced, decided before transaction 2."""

    outcome: CheckOutcome
    messages: Sequence[ProviderMessage] = ()
    error_code: str | None = None
    retry_after: float | None = None  # seconds, from Retry-After or the breaker


def _warn(message: str, event: str, provider: str, error: str) -> None:
    log.warning(message, extra={"event": event, "provider": provider, "error": error})


def provider_or_error(
    provider_for: Any, provider_name: str
) -> tuple[Provider | None, ProviderAnswer]:
    """Build the provider; a missing or misconfigured one is an outcome."""
    try:
        provider: Provider = provider_for(provider_name)
    except Exception as exc:  # removed from the providers file, secret unset, bad options
        error = getattr(exc, "code", type(exc).__name__)
        _warn("provider cannot be built", "provider_misconfigured", provider_name, error)
        return None, ProviderAnswer(
            CheckOutcome.PROVIDER_ERROR, error_code="provider_misconfigured"
        )
    return provider, ProviderAnswer(CheckOutcome.NO_MATCH)


def bulkhead_of(bulkhead_for: Any, provider_name: str) -> Any:
    """The provider's bulkhead, or None (no bulkhead here, or it cannot be
    built: the call is made, as with a breaker that cannot be asked)."""
    if bulkhead_for is None:
        return None
    try:
        return bulkhead_for(provider_name)
    except Exception as exc:
        _warn(
            "provider bulkhead unavailable; calling the provider anyway",
            "bulkhead_unavailable",
            provider_name,
            type(exc).__name__,
        )
        return None


def ask_in_bulkhead(
    bulkhead: Any,
    keeper: LeaseKeeper,
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
    keeper.also_renew = slot.renew if slot is not None else None
    try:
        return ask_provider(provider, breaker_for, query, final=final)
    finally:
        keeper.also_renew = None
        if slot is not None:
            slot.release()


def ask_provider(
    provider: Provider, breaker_for: Any, query: SearchQuery, *, final: bool = False
) -> ProviderAnswer:
    """Ask the provider (through its breaker); every failure is an outcome.

    A `final` check (at or after a deadline) is made even when the breaker is
    open (it still records its outcome): skipping it would leave the signal
    to expire unseen, and it costs the provider one call per batch of
    signals past their deadline.
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
        _warn(
            "provider raised an unexpected error",
            "provider_crash",
            provider_name,
            type(exc).__name__,
        )
        return ProviderAnswer(
            CheckOutcome.PROVIDER_ERROR, error_code="timeout" if timed_out else "bad_response"
        )
    metrics.provider_call(provider_name, time.perf_counter() - began)
    if not admission.clean:  # else a success would change nothing
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
    clean: bool = False


class _Guarded:
    """The breaker, failing open: when its Redis is unreachable the provider
    is still called (a check must not stop because the breaker's store did)."""

    def __init__(self, breaker: Breaker, provider: str) -> None:
        self._breaker, self._provider = breaker, provider

    def _warn(self, exc: Exception) -> None:
        _warn(
            "circuit breaker unavailable; calling the provider anyway",
            "breaker_unavailable",
            self._provider,
            type(exc).__name__,
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
