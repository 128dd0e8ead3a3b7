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
from signalbox.message import (
    Address,
    AsyncAttachment,
    AsyncBoundClaim,
    Attachment,
    BoundClaim,
    Link,
    Message,
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
    "Address",
    "AlreadyClaimed",
    "AlreadyConsumed",
    "AsyncAttachment",
    "AsyncBoundClaim",
    "AsyncClaimLease",
    "AsyncSignalHandle",
    "AsyncSignalbox",
    "Attachment",
    "BoundClaim",
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
    "Link",
    "Mailbox",
    "Message",
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
