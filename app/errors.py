"""One error root for Signalbox, and the failures a caller actually handles."""

from __future__ import annotations


class SignalboxError(Exception):
    """Root of every error Signalbox raises on purpose."""

    code = "signalbox_error"
    status_code = 500
    default_message = "Signalbox could not complete the request."

    def __init__(
        self, message: str | None = None, *, code: str | None = None, **details: object
    ) -> None:
        super().__init__(message or self.default_message)
        self.message = message or self.default_message
        if code is not None:
            self.code = code
        self.details = details


class ConfigurationError(SignalboxError):
    code = "configuration_error"
    default_message = "A setting is missing or invalid."


class ProviderMisconfigured(ConfigurationError):
    """A signal names a provider this process cannot build (removed from the
    providers file, secret unset): its checks are `provider_misconfigured`."""

    code = "provider_misconfigured"
    default_message = "The provider is not configured in this process."


class NotFound(SignalboxError):
    code = "not_found"
    status_code = 404
    default_message = "No such object in this namespace."


class InvalidInput(SignalboxError):
    code = "invalid_input"
    status_code = 422
    default_message = "The request is invalid."

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.field = field


class UnknownProvider(InvalidInput):
    code = "unknown_provider"
    default_message = "No provider of that name is configured."


class IdempotencyConflict(SignalboxError):
    code = "idempotency_conflict"
    status_code = 409
    default_message = "This idempotency key already names a signal with different fields."


class Conflict(SignalboxError):
    """A state conflict whose body the caller must see (already_claimed, run_mismatch, ...)."""

    code = "conflict"
    status_code = 409


class LeaseExpired(Conflict):
    code = "lease_expired"
    default_message = "The claim's lease has lapsed; another consumer may hold the message."


class ProviderError(SignalboxError):
    """A provider could not be read. `transient` says whether retrying can help."""

    code = "provider_error"
    transient = True

    def __init__(
        self,
        message: str | None = None,
        *,
        error_code: str = "provider_error",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, error_code=error_code)
        self.error_code = error_code
        self.retry_after = retry_after


class ProviderUnavailable(ProviderError):
    """Timeouts, refused connections, 5xx, 429: worth retrying later."""

    code = "provider_unavailable"
    transient = True


class ProviderRejected(ProviderError):
    """Authentication or configuration failures: retrying will not help."""

    code = "provider_rejected"
    transient = False


class TooManyRequests(SignalboxError):
    """A bound on concurrent work was reached: retry after `retry_after_seconds`."""

    code = "too_many_requests"
    status_code = 429
    default_message = "Too many requests; retry later."

    def __init__(self, message: str | None = None, *, retry_after_seconds: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class TooManyWaiting(TooManyRequests):
    code = "too_many_waiting"
    default_message = "This namespace has as many waiting signals as it may; retry later."


class TooManyLongPolls(TooManyRequests):
    code = "too_many_long_polls"
    default_message = "This API process holds as many long polls as it may; retry later."


class RecipientNotOwned(SignalboxError):
    code = "recipient_not_owned"
    status_code = 403
    default_message = "The address is owned by another namespace."


class ProviderNotAllowed(SignalboxError):
    code = "provider_not_allowed"
    status_code = 403
    default_message = "The provider is not open to this namespace."


class TooManyMailboxes(TooManyRequests):
    code = "too_many_mailboxes"
    default_message = "This namespace has too many live mailboxes."


class Unauthorized(SignalboxError):
    code = "unauthorized"
    status_code = 401
    default_message = "A valid bearer token is required (Authorization: Bearer <token>)."


class OpsForbidden(SignalboxError):
    code = "ops_forbidden"
    status_code = 403
    default_message = (
        "An operator token triages signals and dead letters; it cannot claim, consume "
        "or read content. Use the namespace's own token."
    )
