"""What a route can answer besides success, for the OpenAPI document:
`responses=errors(401, 404, …)` on every route, each with the error body."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    """`{"error": {"code", "message", "field"?}}`; a state conflict also says `status`."""

    model_config = ConfigDict(extra="allow")

    error: ErrorDetail


class StateBody(BaseModel):
    """A claim's answer in a state other than claimed (`already_claimed`,
    `already_consumed`, `expired`, …) or an error body."""

    model_config = ConfigDict(extra="allow")

    status: str | None = None


DESCRIPTIONS = {
    400: "The request is malformed.",
    401: "No valid bearer token (`unauthorized`); the body is never read.",
    403: "An operator token on a tenant-only route (`ops_forbidden`), or an address "
    "owned by another namespace (`recipient_not_owned`).",
    404: "No such object in the caller's namespace (`not_found`).",
    409: "A conflict with the object's state or idempotency key.",
    410: "The signal expired; its dead letter is given.",
    413: "The request body is larger than SIGNALBOX_API_MAX_BODY_BYTES (`payload_too_large`).",
    422: "Invalid input; `field` names it.",
    429: "A bound was reached (`too_many_waiting`, `too_many_long_polls`); see `Retry-After`.",
    503: "A dependency is unavailable.",
}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer"},
    }
}


def errors(*statuses: int, state: tuple[int, ...] = ()) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` for `statuses`, each with the error body; those in
    `state` answer a state body (`{"status": …}`) instead."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {
            "model": StateBody if status in state else ErrorBody,
            "description": DESCRIPTIONS[status],
        }
        if status == 429:
            entry["headers"] = _RETRY_AFTER
        out[status] = entry
    return out


# Every /v1 route: a token is needed, a body may be too large, a parameter invalid.
V1 = (401, 413, 422)
