"""The answers of claims that took nothing: the signal's state and what its
body shows (`app.domain.claiming.claim_refusal` decided why), and the
answer type every claim use case returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.db import claims as claims_db
from app.db import dead_letters as dead_letters_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db.engine import autocommit
from app.domain.claiming import ClaimOutcome, Refusal
from app.domain.states import Status
from app.errors import Conflict, NotFound
from app.usecases import views


@dataclass(frozen=True)
class Answer:
    """A claim's outcome and its body: the contract gives claims bodies
    whatever the outcome (the front doors map outcomes to codes)."""

    outcome: ClaimOutcome
    body: dict[str, Any]


def refused(namespace: str, signal_id: str, refusal: Refusal) -> Answer:
    """The answer to a claim refused for `refusal`: an error, or the
    signal's state with what its body shows (read now)."""
    if refusal is Refusal.NOT_FOUND:
        raise NotFound(f"no signal {signal_id}")
    if refusal is Refusal.RUN_MISMATCH:
        raise Conflict("run_id is not this signal's run", code="run_mismatch")
    if refusal is Refusal.NO_MESSAGE:
        raise NotFound(f"no message of signal {signal_id}")  # deleted by hand
    with autocommit() as session:
        signal = signals_db.signal_get(session, signal_id, namespace)
        if signal is None:  # deleted meanwhile
            raise NotFound(f"no signal {signal_id}")
        return _refusal(session, signal, refusal)


def _refusal(session: Connection, signal: Mapping[Any, Any], refusal: Refusal) -> Answer:
    status = Status(signal["status"])
    if refusal is Refusal.NOT_CLAIMABLE:
        # It expects no email, or its test ended: there is nothing to claim.
        why = "is cancelled" if status is Status.CANCELLED else "expects no email (expect 'none')"
        raise Conflict(
            f"signal {signal['id']} {why}, result {status.value}: there is nothing to claim",
            code="not_claimable",
        )
    if refusal is Refusal.WAITING:
        now = server_db.db_now(session)
        return _state_answer(
            ClaimOutcome.WAITING,
            signal,
            retry_after_seconds=views.poll_hint(now, signal),
        )
    if refusal is Refusal.EXPIRED:
        dl = dead_letters_db.dead_letter_latest_many(session, [signal["id"]]).get(signal["id"])
        return _state_answer(
            ClaimOutcome.EXPIRED,
            signal,
            reason=signal["expiry_reason"],
            dead_letter=views.dead_letter_view(dl) if dl else None,
        )
    if refusal is Refusal.ALREADY_CONSUMED:
        receipt = claims_db.receipt_by_signal_many(session, [signal["id"]]).get(signal["id"])
        return _state_answer(
            ClaimOutcome.ALREADY_CONSUMED,
            signal,
            receipt=views.receipt_view(receipt) if receipt else None,
        )
    active = claims_db.claim_active_for_signal(session, signal["id"])
    return _state_answer(
        ClaimOutcome.ALREADY_CLAIMED,
        signal,
        claim_id=active["id"] if active else None,
        message_id=signal["message_id"],
        lease_until=views.iso(active["lease_until"]) if active else None,
        owner=active["owner"] if active else None,
    )


def _state_answer(outcome: ClaimOutcome, signal: Mapping[Any, Any], **fields: Any) -> Answer:
    """A claim refused for the signal's state: the outcome as `status`, the
    signal's id, then `fields`."""
    return Answer(outcome, {"status": outcome.value, "signal_id": signal["id"], **fields})
