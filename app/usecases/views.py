"""The JSON views of the contract, built from repository rows.

A view never carries a body, a link or a code: those come only with a claim.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection

from app.db import claims as claims_db
from app.db import dead_letters as dead_letters_db
from app.db import messages as messages_db
from app.db import server as server_db
from app.domain.backoff import poll_hint_seconds
from app.domain.expectations import arrived_sentence
from app.domain.masking import mask_addresses, mask_subject
from app.domain.states import Result, Status, result_of


def iso(value: datetime | None) -> str | None:
    """ISO-8601 UTC with `Z`, millisecond precision."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def encode_cursor(created_at: datetime, object_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), object_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


CURSOR_MAX_CHARS = 256
# Ids are opaque but plain: no NUL, no surrogate, nothing the database rejects.
_CURSOR_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor from `encode_cursor` names; anything else is a 422
    naming `cursor` (never an error of the database or the parser)."""
    from app.errors import InvalidInput

    invalid = InvalidInput("cursor is not one this API returned", field="cursor")
    if not cursor or len(cursor) > CURSOR_MAX_CHARS or not cursor.isascii():
        raise invalid
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        decoded = json.loads(base64.urlsafe_b64decode(padded))
        if not isinstance(decoded, list) or len(decoded) != 2:
            raise invalid
        ts, object_id = decoded
        if not isinstance(ts, str) or not isinstance(object_id, str):
            raise invalid
        if not _CURSOR_ID.fullmatch(object_id) or len(ts) > 40:
            raise invalid
        at = datetime.fromisoformat(ts)
        if at.tzinfo is None:
            raise invalid
        return at.astimezone(UTC), object_id
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise invalid from exc


def operator_view(view: dict[str, Any]) -> dict[str, Any]:
    """A signal view as an operator sees it, in the API and the console alike:
    the message's subject and the near misses' subjects masked (an operator
    never reads content), and no address (the recipient, and any an
    address-naming recommendation holds, become `<address>`)."""
    out = dict(view)
    if isinstance(out.get("recipient"), str):
        out["recipient"] = mask_addresses(out["recipient"])
    if isinstance(out.get("recommendation"), str):
        out["recommendation"] = mask_addresses(out["recommendation"])
    if out.get("message"):
        message = dict(out["message"])
        if message.get("subject"):
            message["subject"] = mask_subject(message["subject"])
        if isinstance(message.get("recipient"), str):
            message["recipient"] = mask_addresses(message["recipient"])
        out["message"] = message
    if out.get("dead_letter"):
        out["dead_letter"] = operator_dead_letter_view(out["dead_letter"])
    return out


def operator_dead_letter_view(view: dict[str, Any]) -> dict[str, Any]:
    """A dead letter as an operator sees it: subjects masked, and no address
    (a recipient typo's near miss and recommendation name two)."""
    out = dict(view)
    out["near_misses"] = [
        _operator_near_miss(m) if isinstance(m, dict) else m for m in (out.get("near_misses") or [])
    ]
    if isinstance(out.get("recommendation"), str):
        out["recommendation"] = mask_addresses(out["recommendation"])
    return out


def _operator_near_miss(near: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in near.items() if k != "address"}
    if out.get("subject"):
        out["subject"] = mask_subject(out["subject"])
    return out


def _copied(row: Mapping[Any, Any], names: Sequence[str]) -> dict[str, Any]:
    """The columns `names` of `row`, in that order, timestamps as `iso`."""
    return {n: iso(row[n]) if isinstance(row[n], datetime) else row[n] for n in names}


def _columns(row: Mapping[Any, Any], id_key: str, names: Sequence[str]) -> dict[str, Any]:
    """`row`'s id as `id_key`, then the columns `names` (see `_copied`)."""
    return {id_key: row["id"], **_copied(row, names)}


def mailbox_view(row: Mapping[Any, Any]) -> dict[str, Any]:
    return _columns(
        row, "mailbox_id", ("run_id", "address", "provider", "created_at", "expires_at")
    )


def receipt_view(row: Mapping[Any, Any]) -> dict[str, Any]:
    return _columns(
        row,
        "receipt_id",
        (
            "signal_id",
            "claim_id",
            "run_id",
            "owner",
            "message_id",
            "claimed_at",
            "consumed_at",
            "evidence",
        ),
    )


def dead_letter_view(row: Mapping[Any, Any]) -> dict[str, Any]:
    return {
        **_columns(
            row,
            "dead_letter_id",
            ("signal_id", "run_id", "reason", "state", "created_at", "resolved_at", "provider"),
        ),
        "checks": {"total": row["checks_total"], "by_outcome": row["checks_by_outcome"]},
        "last_error_code": row["last_error_code"],
        # Masked again on the way out: rows written before subjects were masked.
        "near_misses": [_masked_near_miss(n) for n in row["near_misses"] or []],
        "recommendation": row["recommendation"],
        "late_message": row.get("late_message"),
        "duplicates": row.get("duplicates"),
        "note": row["note"],
    }


def _masked_near_miss(near: Any) -> Any:
    if isinstance(near, dict) and isinstance(near.get("subject"), str):
        return {**near, "subject": mask_subject(near["subject"])}
    return near


def claim_summary(row: Mapping[Any, Any]) -> dict[str, Any]:
    return _columns(row, "claim_id", ("message_id", "claimed_at", "lease_until", "owner"))


# Copied as they are into a signal's view, after its status and result.
_SIGNAL_COLUMNS = (
    "expiry_reason",
    "recipient",
    "subject_contains",
    "body_contains",
    "provider",
    "require_run_marker",
    "metadata",
    "created_at",
    "received_after",
    "expires_at",
    "found_at",
    "expect",
    "settle_seconds",
)


def poll_hint(now: datetime, row: Mapping[Any, Any]) -> int:
    """A pending signal's `retry_after_seconds`: when the caller's next look is
    due (docs/api.md, "Signals"), short for a provider that pushes (the sink)."""
    from app.providers.runtime import pushes
    from app.settings import get_settings

    return poll_hint_seconds(
        now, row["next_check_at"], pushes=pushes(get_settings(), row["provider"])
    )


def _needed(session: Connection | None) -> Connection:
    if session is None:  # a view made from a notification that cannot be
        raise ValueError("this signal's view needs the database")
    return session


def signal_views(
    session: Connection | None, rows: Sequence[Mapping[Any, Any]]
) -> list[dict[str, Any]]:
    """Views of several signals, asking the database only for what their
    statuses show: the clock for pending ones (retry_after_seconds), the
    message when one was found, the active claim of claimed ones, the receipt
    of consumed ones, the latest dead letter of expired ones. A waiting or
    found signal read with `signals_db.signal_view_get` needs no query at all
    here, nor a `found`, `arrived` or `absent` one from the notification that
    ended its wait: those are made with no `session` (None)."""
    if not rows:
        return []
    status_of = {r["id"]: Status(r["status"]) for r in rows}
    pending = any(
        result_of(status_of[r["id"]], r["last_outcome"]) in (Result.WAITING, Result.PROVIDER_ERROR)
        for r in rows
    )
    now = None
    if pending:
        given = [r["view_now"] for r in rows if "view_now" in r]
        now = given[0] if given else server_db.db_now(_needed(session))
    messages: dict[str, Mapping[Any, Any]] = {
        r["message_id"]: _joined_message(r) for r in rows if r["message_id"] and _has_message(r)
    }
    wanted = [r["message_id"] for r in rows if r["message_id"] and r["message_id"] not in messages]
    if wanted:
        messages.update(messages_db.message_get_many(_needed(session), wanted))

    def having(status: Status) -> list[str]:
        return [sid for sid, s in status_of.items() if s is status]

    claimed, consumed, expired = (
        having(Status.CLAIMED),
        having(Status.CONSUMED),
        having(Status.EXPIRED),
    )
    claims = claims_db.claim_active_many(_needed(session), claimed) if claimed else {}
    receipts = claims_db.receipt_by_signal_many(_needed(session), consumed) if consumed else {}
    dead = dead_letters_db.dead_letter_latest_many(_needed(session), expired) if expired else {}
    out = []
    for r in rows:
        status = Status(r["status"])
        result = result_of(status, r["last_outcome"])
        message = messages.get(r["message_id"]) if r["message_id"] else None
        claim = claims.get(r["id"])
        receipt = receipts.get(r["id"])
        dead_letter = dead.get(r["id"]) if status is Status.EXPIRED else None
        out.append(
            {
                **_columns(r, "signal_id", ("run_id", "test_case")),
                "status": status.value,
                "result": result.value,
                **_copied(r, _SIGNAL_COLUMNS),
                "checks": r["checks_count"],
                "max_checks": r["max_checks"],
                "retry_after_seconds": (
                    poll_hint(now, r)
                    if now is not None and result in (Result.WAITING, Result.PROVIDER_ERROR)
                    else None
                ),
                "last_check": (
                    {
                        "at": iso(r["last_check_at"]),
                        "outcome": r["last_outcome"],
                        "error_code": r["last_error_code"],
                    }
                    if r["last_check_at"]
                    else None
                ),
                "message": (
                    {
                        "message_id": message["id"],
                        "received_at": iso(message["received_at"]),
                        "subject": message["subject"],
                        "recipient": r["recipient"],
                        "run_marker": message["run_marker"],
                        "bare_lf": bool(message.get("bare_lf")),
                    }
                    if message
                    else None
                ),
                "claim": claim_summary(claim) if claim else None,
                "receipt": receipt_view(receipt) if receipt else None,
                "dead_letter": dead_letter_view(dead_letter) if dead_letter else None,
                "recommendation": _arrived_recommendation(r, message)
                if status is Status.ARRIVED
                else None,
                "cancellation": _cancellation(r) if status is Status.CANCELLED else None,
            }
        )
    return out


def _arrived_recommendation(
    row: Mapping[Any, Any], message: Mapping[Any, Any] | None
) -> str | None:
    """The sentence an `arrived` signal (`expect: none`) carries: no dead letter
    is made for it, so its view says what to do."""
    if message is None:
        return None
    return arrived_sentence((message["received_at"] - row["received_after"]).total_seconds())


def _cancellation(row: Mapping[Any, Any]) -> dict[str, Any]:
    """Why and when a cancelled signal was cancelled."""
    return {"reason": row.get("cancel_reason"), "cancelled_at": iso(row.get("cancelled_at"))}


def _has_message(row: Mapping[Any, Any]) -> bool:
    """Whether `row` carries its message's summary (from `signals_db.signal_view_get`)."""
    return "view_message_id" in row and row["view_message_id"] is not None


def _joined_message(row: Mapping[Any, Any]) -> dict[str, Any]:
    return {
        "id": row["view_message_id"],
        "received_at": row["view_message_received_at"],
        "subject": row["view_message_subject"],
        "run_marker": row["view_message_run_marker"],
        "bare_lf": row["view_message_bare_lf"],
    }
