"""What the check runner is given and asked: its dependencies as Protocols,
the request (which signal, and why) and the report."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from app.infra import dispatch
from app.providers.base import Provider
from app.settings import Settings
from app.usecases.checks.call import Breaker
from app.usecases.checks.observed import Parser as Parser  # one of the runner's ports

# At most this many signals in one check (one provider call).
BATCH_LIMIT = 200


class ProviderLookup(Protocol):
    """The provider named `name` (raises when it cannot be built)."""

    def __call__(self, name: str, /) -> Provider: ...


class BreakerLookup(Protocol):
    """The circuit breaker of the provider named `name`."""

    def __call__(self, name: str, /) -> Breaker: ...


class Slot(Protocol):
    def renew(self) -> Any: ...
    def release(self) -> Any: ...


class Bulkhead(Protocol):
    def acquire(self) -> Slot | None: ...


class BulkheadLookup(Protocol):
    """A worker's bulkhead of the provider named `name`."""

    def __call__(self, name: str, /) -> Bulkhead: ...


class TaskSender(Protocol):
    """Sends the Celery tasks a check leaves to a worker."""

    def check(self, signal_id: str) -> None: ...
    def first_look(self, provider: str, signal_id: str) -> None: ...
    def first_look_started(self, signal_id: str) -> None: ...


class DispatchTasks:
    """The task sender of `app.infra.dispatch` (Celery through the broker)."""

    def __init__(self, settings: Settings) -> None:
        self.ttl_seconds = settings.requeue_after_seconds

    def check(self, signal_id: str) -> None:
        dispatch.enqueue_check(signal_id)

    def first_look(self, provider: str, signal_id: str) -> None:
        dispatch.enqueue_first_look(provider, signal_id, self.ttl_seconds)

    def first_look_started(self, signal_id: str) -> None:
        dispatch.first_look_started(signal_id)


class Why(StrEnum):
    """Who asks for a check."""

    TASK = "task"  # the Celery task (a worker's check)
    PUSH = "push"  # the sink: mail arrived for the signal's recipient
    SWEEP = "sweep"  # the sweep found the signal due
    FIRST_LOOK = "first_look"  # the API, after the create's commit


@dataclass(frozen=True)
class CheckRequest:
    """Check `signal_id` (and its provider's other due signals), because `why`.
    `taken`: the rows a push's statement took for this check already;
    `created`: a new signal's row as its create returned it (a first look,
    made in one statement when the sink holds no mail for it)."""

    signal_id: str
    why: Why
    provider: str = ""
    taken: Sequence[Any] | None = None
    created: Mapping[str, Any] | None = None


@dataclass
class CheckReport:
    provider: str | None = None
    signals: int = 0
    outcome: str | None = None
    found: list[str] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)
    # Pushed while their check ran: checked again at once.
    pushed: list[str] = field(default_factory=list)
