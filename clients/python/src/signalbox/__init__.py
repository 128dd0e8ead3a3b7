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
    EmailArrived,
    IdempotencyConflict,
    InvalidId,
    InvalidRequest,
    LeaseExpired,
    NotClaimable,
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
    Match,
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
    "EmailArrived",
    "Evidence",
    "EvidenceSignal",
    "IdempotencyConflict",
    "InvalidId",
    "InvalidRequest",
    "LeaseExpired",
    "Mailbox",
    "Match",
    "MessageSummary",
    "NearMiss",
    "NotClaimable",
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
