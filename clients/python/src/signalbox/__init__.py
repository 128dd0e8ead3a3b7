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
    NotCancellable,
    NotClaimable,
    NotFound,
    RunMismatch,
    ServiceUnavailable,
    SignalboxError,
    SignalCancelled,
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
    Match,
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
    "EmailArrived",
    "Evidence",
    "EvidenceSignal",
    "IdempotencyConflict",
    "InvalidId",
    "InvalidRequest",
    "LeaseExpired",
    "Link",
    "Mailbox",
    "Match",
    "Message",
    "MessageSummary",
    "NearMiss",
    "NotCancellable",
    "NotClaimable",
    "NotFound",
    "Page",
    "Receipt",
    "RunMismatch",
    "ServiceUnavailable",
    "Signal",
    "SignalCancelled",
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
