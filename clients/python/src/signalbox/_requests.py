"""Request building: each API call as a :class:`Call`, with ids checked and encoded.

Nothing here does I/O. A :class:`Call` says what to send (method, path, query,
JSON body, headers) and whether repeating it is harmless, so the retry policy
in :mod:`signalbox._core` is the same for every transport.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from signalbox.errors import InvalidId, hide_client_frames

# pytest: a Signalbox error's traceback leaves this module's frames out.
__tracebackhide__ = hide_client_frames

#: The server answers a long poll after at most this many seconds.
SERVER_MAX_WAIT = 60
#: Extra read time allowed on top of a long poll's ``wait``.
LONG_POLL_MARGIN = 15.0


@dataclass(frozen=True)
class Call:
    """One HTTP request to the API, and whether repeating it is harmless."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Safe to repeat after a connection error or a 5xx (GETs, idempotent create, consume).
    retry: bool = False
    timeout: float | None = None


# --- ids in paths ------------------------------------------------------------

#: The prefix of each kind of id the client puts in a path.
ID_PREFIXES = {"signal": "sig_", "claim": "clm_", "dead_letter": "dlq_", "mailbox": "mbx_"}
_ID_BODY = re.compile(r"[A-Za-z0-9_-]{1,128}")
_RUN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _shown(value: object) -> str:
    text = repr(value)  # repr escapes control characters
    return text if len(text) <= 60 else text[:57] + "..."


def checked_id(kind: str, value: object) -> str:
    """``value`` if it is a well-formed id of ``kind`` (``signal``, ``claim``,
    ``dead_letter``, ``mailbox``), else :class:`InvalidId`."""
    prefix = ID_PREFIXES[kind]
    if (
        isinstance(value, str)
        and value.startswith(prefix)
        and _ID_BODY.fullmatch(value[len(prefix) :])
    ):
        return value
    name = kind.replace("_", " ")
    raise InvalidId(
        f"not a {name} id: {_shown(value)} (expected {prefix!r} then letters, digits, '_' or '-')",
        field=f"{kind}_id",
    )


def checked_run_id(value: object) -> str:
    """``value`` if it is a run id the API accepts (1-128 of ``[A-Za-z0-9._:-]``,
    not only dots), else :class:`InvalidId`."""
    if isinstance(value, str) and _RUN_ID.fullmatch(value) and value.strip("."):
        return value
    raise InvalidId(
        f"not a run id: {_shown(value)} (expected 1-128 of letters, digits, '.', '_', ':' or '-')",
        field="run_id",
    )


def segment(value: str) -> str:
    """One path segment, percent-encoded: ``/``, ``?``, ``#`` and ``%`` included."""
    return quote(value, safe="")


def _id_path(template: str, kind: str, value: object) -> str:
    return template.format(segment(checked_id(kind, value)))


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def mailbox_delete_call(mailbox_id: str) -> Call:
    return Call("DELETE", _id_path("/v1/mailboxes/{}", "mailbox", mailbox_id))


def mailbox_call(run_id: str, provider: str) -> Call:
    # Each POST makes a new address, so a blind retry could make two: not retried.
    return Call("POST", "/v1/mailboxes", json={"run_id": run_id, "provider": provider})


def watch_call(
    *,
    run_id: str,
    test_case: str,
    recipient: str,
    subject_contains: str | None,
    body_contains: str | None,
    expires_in_seconds: int | None,
    max_checks: int | None,
    provider: str | None,
    require_run_marker: bool,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
    received_after: str | None = None,
    expect: str | None = None,
    settle_seconds: int | None = None,
) -> Call:
    body = _drop_none(
        {
            "run_id": run_id,
            "test_case": test_case,
            "recipient": recipient,
            "subject_contains": subject_contains,
            "body_contains": body_contains,
            "received_after": received_after,
            "expires_in_seconds": expires_in_seconds,
            "max_checks": max_checks,
            "provider": provider,
            "metadata": dict(metadata) if metadata is not None else None,
            "expect": expect,
            "settle_seconds": settle_seconds,
        }
    )
    if require_run_marker:
        body["require_run_marker"] = True
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    # Idempotent by key (the header, or run_id:test_case on the server), so a retry
    # after a lost response returns the same signal instead of making a second one.
    return Call("POST", "/v1/signals", json=body, headers=headers, retry=True)


def signal_call(signal_id: str, wait: int = 0) -> Call:
    params = {"wait": wait} if wait else {}
    timeout = wait + LONG_POLL_MARGIN if wait else None
    return Call(
        "GET",
        _id_path("/v1/signals/{}", "signal", signal_id),
        params=params,
        retry=True,
        timeout=timeout,
    )


def long_poll_seconds(remaining: float) -> int:
    """The ``wait`` to ask for when ``remaining`` seconds of the caller's budget are left."""
    return max(1, min(SERVER_MAX_WAIT, math.ceil(remaining)))


def claim_call(signal_id: str, run_id: str, lease_seconds: int, owner: str | None = None) -> Call:
    # Never retried: a lost 200 would look like "already_claimed" on the second try.
    return Call(
        "POST",
        _id_path("/v1/signals/{}/claim", "signal", signal_id),
        json=_drop_none({"run_id": run_id, "lease_seconds": lease_seconds, "owner": owner}),
    )


def matches_call(signal_id: str) -> Call:
    return Call("GET", _id_path("/v1/signals/{}/matches", "signal", signal_id), retry=True)


def cancel_call(signal_id: str, reason: str) -> Call:
    # Cancelling again answers the same view, so a retry is harmless.
    return Call(
        "POST",
        _id_path("/v1/signals/{}/cancel", "signal", signal_id),
        json={"reason": reason},
        retry=True,
    )


def consume_call(claim_id: str) -> Call:
    # Consuming again returns the same receipt, so a retry is harmless.
    return Call("POST", _id_path("/v1/claims/{}/consume", "claim", claim_id), retry=True)


def release_call(claim_id: str) -> Call:
    return Call("POST", _id_path("/v1/claims/{}/release", "claim", claim_id))


def extend_call(claim_id: str, lease_seconds: int) -> Call:
    return Call(
        "POST",
        _id_path("/v1/claims/{}/extend", "claim", claim_id),
        json={"lease_seconds": lease_seconds},
    )


def evidence_call(run_id: str) -> Call:
    return Call("GET", f"/v1/runs/{segment(checked_run_id(run_id))}/evidence", retry=True)


def signals_call(run_id: str, cursor: str | None = None, limit: int | None = None) -> Call:
    params = _drop_none({"run_id": run_id, "cursor": cursor, "limit": limit})
    return Call("GET", "/v1/signals", params=params, retry=True)


def dead_letters_call(
    state: str | None,
    reason: str | None,
    provider: str | None,
    cursor: str | None = None,
    limit: int | None = None,
    **filters: str | None,
) -> Call:
    """``filters``: ``run_id``, ``test_case``, ``why`` (as the API names them)."""
    params = _drop_none(
        {
            "state": state,
            "reason": reason,
            "provider": provider,
            **filters,
            "cursor": cursor,
            "limit": limit,
        }
    )
    return Call("GET", "/v1/dead-letters", params=params, retry=True)


def dead_letters_bulk_call(action: str, body: dict[str, Any]) -> Call:
    """``POST /v1/dead-letters/redrive`` or ``/discard``: every open dead letter
    matching ``body["filter"]``, up to ``body["limit"]``."""
    return Call("POST", f"/v1/dead-letters/{action}", json=_drop_none(body))


def dead_letter_call(dead_letter_id: str) -> Call:
    return Call("GET", _id_path("/v1/dead-letters/{}", "dead_letter", dead_letter_id), retry=True)


def redrive_call(
    dead_letter_id: str, expires_in_seconds: int | None, max_checks: int | None
) -> Call:
    body = _drop_none({"expires_in_seconds": expires_in_seconds, "max_checks": max_checks})
    return Call(
        "POST", _id_path("/v1/dead-letters/{}/redrive", "dead_letter", dead_letter_id), json=body
    )


def discard_call(dead_letter_id: str, note: str | None) -> Call:
    return Call(
        "POST",
        _id_path("/v1/dead-letters/{}/discard", "dead_letter", dead_letter_id),
        json=_drop_none({"note": note}),
    )
