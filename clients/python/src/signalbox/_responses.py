"""Response parsing: a status and a body become a result or the client's exception.

Nothing here does I/O: a transport hands over what it received (anything
shaped like :class:`Response`) and gets back the decoded JSON, or the
:class:`~signalbox.errors.SignalboxError` subclass the answer means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from signalbox import errors
from signalbox._requests import Call
from signalbox.models import Claim, DeadLetter, Page, Receipt

# pytest: a Signalbox error's traceback leaves this module's frames out.
__tracebackhide__ = errors.hide_client_frames


class Response(Protocol):
    """What a transport received for one request (``httpx.Response`` is one)."""

    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def decode(resp: Response, call: Call) -> tuple[int, Any]:
    """The status and decoded body of a 2xx answer (JSON, else text, else ``None``);
    raises the matching :class:`~signalbox.errors.SignalboxError` for any other."""
    body: Any = None
    if resp.content:
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
    if resp.status_code >= 400:
        raise error_for(resp.status_code, body, f"{call.method} {call.path}")
    return resp.status_code, body


def claim_from(status: int, body: Any, signal_id: str) -> Claim:
    """The claim a claim answer holds; raises
    :class:`~signalbox.errors.SignalNotReady` when it says ``waiting``."""
    data = body if isinstance(body, Mapping) else {}
    if status == 202 or data.get("status") == "waiting":
        retry = data.get("retry_after_seconds")
        raise errors.SignalNotReady(
            f"signal {signal_id} has no matching message yet",
            status=status,
            code="waiting",
            body=body,
            retry_after_seconds=float(retry) if isinstance(retry, int | float) else None,
        )
    return Claim.from_api(data, signal_id)


def dead_letter_page(body: Any) -> Page[DeadLetter]:
    """One page of the dead-letter list route."""
    data = body if isinstance(body, Mapping) else {}
    return Page(
        items=tuple(
            DeadLetter.from_api(i) for i in data.get("items", []) if isinstance(i, Mapping)
        ),
        next_cursor=data.get("next_cursor"),
    )


def _payload(body: Any) -> dict[str, Any]:
    """The meaningful object of an error body (unwrapping FastAPI's ``detail`` if present)."""
    if not isinstance(body, Mapping):
        return {}
    detail = body.get("detail")
    if isinstance(detail, Mapping) and "error" not in body:
        return dict(detail)
    return dict(body)


def _error_parts(payload: Mapping[str, Any]) -> tuple[str | None, str | None]:
    err = payload.get("error")
    if isinstance(err, Mapping):
        code, message = err.get("code"), err.get("message")
        return (
            code if isinstance(code, str) else None,
            message if isinstance(message, str) else None,
        )
    if isinstance(err, str):
        return err, None
    message = payload.get("message")
    return None, message if isinstance(message, str) else None


def invalid_field(body: Any) -> str | None:
    """The field a 422 names, from ``error.field``/``error.details`` or FastAPI's ``detail``."""
    payload = body if isinstance(body, Mapping) else {}
    err = payload.get("error")
    candidates: list[Any] = []
    if isinstance(err, Mapping):
        if isinstance(err.get("field"), str):
            return str(err["field"])
        for key in ("details", "fields", "errors"):
            if isinstance(err.get(key), list):
                candidates.extend(err[key])
    if isinstance(payload.get("detail"), list):
        candidates.extend(payload["detail"])
    for item in candidates:
        if isinstance(item, str):
            return item
        if not isinstance(item, Mapping):
            continue
        if isinstance(item.get("field"), str):
            return str(item["field"])
        loc = item.get("loc")
        if isinstance(loc, list) and loc:
            parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
            return ".".join(parts) or str(loc[-1])
    return None


_CONFLICTS: dict[str, type[errors.Conflict]] = {
    "already_claimed": errors.AlreadyClaimed,
    "already_consumed": errors.AlreadyConsumed,
    "lease_expired": errors.LeaseExpired,
    "run_mismatch": errors.RunMismatch,
    "not_claimable": errors.NotClaimable,
    "not_cancellable": errors.NotCancellable,
    "idempotency_conflict": errors.IdempotencyConflict,
}


def error_for(status: int, body: Any, what: str = "") -> errors.SignalboxError:
    """Map a non-2xx answer to the client's exception (both body shapes accepted)."""
    payload = _payload(body)
    code, message = _error_parts(payload)
    text = body if isinstance(body, str) and body else None
    prefix = f"{what}: " if what else ""
    if status == 401 or status == 403:
        return errors.Unauthorized(
            prefix + (message or errors.Unauthorized.default_message),
            status=status,
            code=code,
            body=body,
        )
    if status == 404:
        return errors.NotFound(
            prefix + (message or "not found"), status=status, code=code, body=body
        )
    if status == 409:
        kind = payload.get("status") if isinstance(payload.get("status"), str) else None
        kind = kind if kind in _CONFLICTS else code
        cls = _CONFLICTS.get(kind or "", errors.Conflict)
        msg = prefix + (message or (kind or "conflict").replace("_", " "))
        # Only the two conflicts that carry more than a code take extra attributes.
        extra: dict[str, Any] = {}
        if cls is errors.AlreadyClaimed:
            extra = {
                "claim_id": payload.get("claim_id"),
                "lease_until": payload.get("lease_until"),
                "owner": payload.get("owner"),
            }
        elif cls is errors.AlreadyConsumed:
            extra = {"receipt": Receipt.maybe(payload.get("receipt"))}
        return cls(msg, status=status, code=kind or code, body=body, **extra)
    if status == 410:
        dead_letter = DeadLetter.maybe(payload.get("dead_letter"))
        return errors.SignalExpired(
            prefix + expired_message(dead_letter, message),
            status=status,
            code=code or "expired",
            body=body,
            dead_letter=dead_letter,
        )
    if status in (400, 422):
        field_name = invalid_field(body)
        detail = message or (f"invalid field {field_name!r}" if field_name else "invalid request")
        if field_name and field_name not in detail:
            detail = f"{detail} (field {field_name!r})"
        return errors.InvalidRequest(
            prefix + detail, status=status, code=code, body=body, field=field_name
        )
    if status >= 500:
        return errors.ServiceUnavailable(
            prefix + f"server error {status}" + (f": {message}" if message else ""),
            status=status,
            code=code,
            body=body,
        )
    return errors.SignalboxError(
        prefix + (message or text or f"unexpected HTTP {status}"),
        status=status,
        code=code,
        body=body,
    )


def expired_message(dead_letter: DeadLetter | None, fallback: str | None = None) -> str:
    """One line for an expired signal: reason and the server's recommendation."""
    if dead_letter is None or not dead_letter.is_diagnosed:
        return fallback or "expired"
    text = f"expired ({dead_letter.reason})"
    if dead_letter.recommendation:
        text += f": {dead_letter.recommendation}"
    return text
