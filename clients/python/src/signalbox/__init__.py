"""Signalbox client: wait for an expected email as a contract.

Sync: :class:`Signalbox`; asyncio: :class:`AsyncSignalbox`. Both read
``SIGNALBOX_URL`` and ``SIGNALBOX_TOKEN`` when ``url``/``token`` are not given.
"""

from signalbox.aio import AsyncClaimLease, AsyncSignalbox, AsyncSignalHandle
from signalbox.client import ClaimLease, Signalbox, SignalHandle
from signalbox.errors import (
    AlreadyClaimed,
    AlreadyConsumed,
    Conflict,
    IdempotencyConflict,
    InvalidId,
    InvalidRequest,
    LeaseExpired,
    NotFound,
    RunMismatch,
    ServiceUnavailable,
    SignalboxError,
    SignalExpired,
    SignalNotReady,
    Unauthorized,
    WaitTimeout,
)
from signalbox.models import (
    Claim,
    DeadLetter,
    Evidence,
    EvidenceSignal,
    Mailbox,
    MessageSummary,
    NearMiss,
    Page,
    Receipt,
    Signal,
)

__all__ = [
    "AlreadyClaimed",
    "AlreadyConsumed",
    "AsyncClaimLease",
    "AsyncSignalHandle",
    "AsyncSignalbox",
    "Claim",
    "ClaimLease",
    "Conflict",
    "DeadLetter",
    "Evidence",
    "EvidenceSignal",
    "IdempotencyConflict",
    "InvalidId",
    "InvalidRequest",
    "LeaseExpired",
    "Mailbox",
    "MessageSummary",
    "NearMiss",
    "NotFound",
    "Page",
    "Receipt",
    "RunMismatch",
    "ServiceUnavailable",
    "Signal",
    "SignalExpired",
    "SignalHandle",
    "SignalNotReady",
    "Signalbox",
    "SignalboxError",
    "Unauthorized",
    "WaitTimeout",
]


def _name_errors_here() -> None:
    """Exported errors read as ``signalbox.SignalExpired: …`` in a traceback and in
    pytest's one-line summary, where ``signalbox.errors.`` pushed the name out."""
    pending: list[type] = [SignalboxError]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__ == "signalbox.errors" and globals().get(cls.__name__) is cls:
            cls.__module__ = __name__


_name_errors_here()
