"""The client's exceptions: one root, and a subclass per failure a caller handles.

Every error keeps the HTTP ``status`` and the decoded response ``body`` (when
there was one) so a caller can log or print exactly what the server said.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from signalbox.models import DeadLetter, NearMiss, Receipt, Signal


def hide_client_frames(excinfo: Any) -> bool:
    """The ``__tracebackhide__`` of the client's modules: pytest leaves their
    frames out of a failure's traceback when the error is a Signalbox error (the
    test's own line and the exception say it all); any other exception, a bug
    of the client, keeps them."""
    return isinstance(getattr(excinfo, "value", None), SignalboxError)


class SignalboxError(Exception):
    """Root of every error raised by the Signalbox client."""

    default_message = "Signalbox request failed"

    def __init__(
        self,
        message: str | None = None,
        *,
        status: int | None = None,
        code: str | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message or self.default_message)
        self.message = message or self.default_message
        self.status = status
        self.code = code
        self.body = body


class Unauthorized(SignalboxError):
    """The token is missing or not valid (HTTP 401)."""

    default_message = "unauthorized: check SIGNALBOX_TOKEN / --token"


class NotFound(SignalboxError):
    """The object does not exist in the token's namespace (HTTP 404)."""

    default_message = "not found"


class InvalidRequest(SignalboxError):
    """The server rejected the input (HTTP 422); ``field`` names the offending field."""

    default_message = "invalid request"

    def __init__(self, message: str | None = None, *, field: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.field = field


class InvalidId(InvalidRequest, ValueError):
    """An id or run id given to the client is not well formed; nothing was sent.

    Ids are checked by prefix (``sig_``, ``clm_``, ``dlq_``, ``mbx_``) and
    character set before they go into a URL, so a crafted id can never reach
    another route.
    """

    default_message = "invalid id"


class Conflict(SignalboxError):
    """The request conflicts with the signal's state (HTTP 409); ``code`` says which."""

    default_message = "conflict"


class AlreadyClaimed(Conflict):
    """Another holder has an active lease on this signal's message."""

    default_message = "already claimed"

    def __init__(
        self,
        message: str | None = None,
        *,
        claim_id: str | None = None,
        lease_until: str | None = None,
        owner: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.claim_id = claim_id
        self.lease_until = lease_until
        #: Who holds the active claim.
        self.owner = owner


class AlreadyConsumed(Conflict):
    """The signal was already consumed; ``receipt`` is the existing receipt."""

    default_message = "already consumed"

    def __init__(self, message: str | None = None, *, receipt: Receipt | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.receipt = receipt


class LeaseExpired(Conflict):
    """The claim's lease lapsed before consume: a stale holder can never consume."""

    default_message = "lease expired"


class RunMismatch(Conflict):
    """The ``run_id`` given is not the signal's run."""

    default_message = "run mismatch"


class NotClaimable(Conflict):
    """The signal expects no email (``expect="none"``): there is nothing to claim."""

    default_message = "not claimable"


class NotCancellable(Conflict):
    """The signal already ended otherwise (consumed, expired, absent, arrived):
    only a waiting, found or claimed signal can be cancelled."""

    default_message = "not cancellable"


class SignalCancelled(SignalboxError):
    """The signal was cancelled (its test ended or failed): nothing will match it.
    ``signal`` is its last view; ``reason`` the reason it was cancelled with."""

    default_message = "signal cancelled"

    def __init__(
        self,
        message: str | None = None,
        *,
        signal: Signal | None = None,
        reason: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.signal = signal
        self.reason = reason


class IdempotencyConflict(Conflict):
    """The idempotency key exists with a different recipient, test case, filters or provider."""

    default_message = "idempotency conflict"


class SignalNotReady(SignalboxError):
    """A claim was attempted before a message matched (HTTP 202 ``waiting``)."""

    default_message = "no matching message yet"

    def __init__(
        self, message: str | None = None, *, retry_after_seconds: float | None = None, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.retry_after_seconds = retry_after_seconds


class SignalExpired(SignalboxError):
    """The signal ended without a usable message; carries the dead letter's diagnosis.

    ``reason`` is one of ``deadline``, ``check_budget``, ``provider_errors``,
    ``claims_exhausted``, ``duplicate_messages`` (``expect="exactly_one"``: see
    ``dead_letter.duplicates``); ``recommendation`` is the server's one actionable
    sentence; ``near_misses`` are messages to the recipient that failed one rule.
    """

    default_message = "signal expired"

    def __init__(
        self,
        message: str | None = None,
        *,
        dead_letter: DeadLetter | None = None,
        signal: Signal | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.dead_letter = dead_letter
        self.signal = signal

    @property
    def reason(self) -> str | None:
        return self.dead_letter.reason if self.dead_letter else None

    @property
    def recommendation(self) -> str | None:
        return self.dead_letter.recommendation if self.dead_letter else None

    @property
    def near_misses(self) -> list[NearMiss]:
        return list(self.dead_letter.near_misses) if self.dead_letter else []


class EmailArrived(SignalboxError, AssertionError):
    """A signal that expected no email (``expect="none"``) saw one arrive.

    ``signal`` is its view: ``signal.message`` is the message that came and
    ``recommendation`` the server's sentence. An ``AssertionError`` too, so a
    test that expected silence fails as an assertion.
    """

    default_message = "an email arrived where none was expected"

    def __init__(self, message: str | None = None, *, signal: Signal | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.signal = signal

    @property
    def recommendation(self) -> str | None:
        return self.signal.recommendation if self.signal else None


class WaitTimeout(SignalboxError):
    """The client's own ``timeout`` passed while the signal was still waiting.

    The signal itself is not expired: ``signal`` is its last view and
    ``expires_at`` when it will expire (then ``wait()`` again, without a
    timeout, ends with the found view or :class:`SignalExpired` and its
    diagnosis).
    """

    default_message = "timed out waiting for the signal"

    def __init__(self, message: str | None = None, *, signal: Signal | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.signal = signal

    @property
    def expires_at(self) -> datetime | None:
        return self.signal.expires_at if self.signal is not None else None


class ServiceUnavailable(SignalboxError):
    """The service could not be reached or kept failing (connection error, timeout, 5xx)."""

    default_message = "Signalbox service unavailable"
