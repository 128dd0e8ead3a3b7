"""The run's evidence artifact for CI: what happened, provably, and nothing secret.

It holds no body, no link, no code and no token (subjects are masked);
recipients appear only as their recipient hash, keyed with the deployment's
key (`app.infra.keys`), so a guessed address cannot be hashed to find them.
"""

from __future__ import annotations

from typing import Any

from app.db import checks as checks_db
from app.db import claims as claims_db
from app.db import dead_letters as dead_letters_db
from app.db import messages as messages_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db.engine import transaction
from app.domain.masking import PLAIN_ADDRESS_RE, mask_subject
from app.domain.states import CheckOutcome, Status, result_of
from app.errors import NotFound
from app.infra.keys import recipient_hash
from app.usecases import views


def run_evidence(namespace: str, run_id: str) -> dict[str, Any]:
    with transaction() as session:
        ids = signals_db.signal_ids_by_run(session, namespace, run_id)
        if not ids:
            raise NotFound(f"no signals for run {run_id}")
        rows = signals_db.signal_rows_many(session, ids)
        counts = checks_db.check_counts_by_outcome(session, ids)
        messages = messages_db.message_get_many(
            session, [r["message_id"] for r in rows if r["message_id"]]
        )
        receipts = claims_db.receipt_by_signal_many(session, ids)
        latest_claims = claims_db.claim_latest_many(session, ids)
        dead = dead_letters_db.dead_letter_latest_many(session, ids)
        generated_at = server_db.db_now(session)
    signals = []
    by_status: dict[str, int] = {}
    for r in rows:
        status = Status(r["status"])
        by_status[status.value] = by_status.get(status.value, 0) + 1
        sig_counts = dict(counts.get(r["id"], {}))
        for outcome, n in (r["checks_archived"] or {}).items():
            sig_counts[outcome] = sig_counts.get(outcome, 0) + int(n)
        message = messages.get(r["message_id"]) if r["message_id"] else None
        receipt = receipts.get(r["id"])
        dl = dead.get(r["id"])
        latest_claim = latest_claims.get(r["id"])
        claimed_at = (
            receipt["claimed_at"]
            if receipt
            else latest_claim["claimed_at"]
            if latest_claim
            else None
        )
        signals.append(
            {
                "signal_id": r["id"],
                "test_case": r["test_case"],
                "status": status.value,
                "result": result_of(status, r["last_outcome"]).value,
                "expiry_reason": r["expiry_reason"],
                "provider": r["provider"],
                "recipient_hash": recipient_hash(r["recipient"]),
                "filters": {
                    "subject_contains": r["subject_contains"] is not None,
                    "body_contains": r["body_contains"] is not None,
                    "require_run_marker": r["require_run_marker"],
                },
                "metadata": r["metadata"],
                "expectation": _expectation(r, status),
                "timings": {
                    "created_at": views.iso(r["created_at"]),
                    "received_after": views.iso(r["received_after"]),
                    "found_at": views.iso(r["found_at"]),
                    "claimed_at": views.iso(claimed_at),
                    "consumed_at": views.iso(receipt["consumed_at"]) if receipt else None,
                    "expired_at": views.iso(r["expired_at"]),
                    "cancelled_at": views.iso(r["cancelled_at"]),
                    "expires_at": views.iso(r["expires_at"]),
                    "seconds_to_found": (
                        round((r["found_at"] - r["created_at"]).total_seconds(), 3)
                        if r["found_at"]
                        else None
                    ),
                },
                "checks": {
                    "total": sum(sig_counts.values()),
                    "by_outcome": {o.value: sig_counts.get(o.value, 0) for o in CheckOutcome},
                    "max_checks": r["max_checks"],
                },
                "message": (
                    {
                        "message_id": message["id"],
                        "received_at": views.iso(message["received_at"]),
                        # Evidence leaves the signal's own view: no code or link token.
                        "subject": mask_subject(message["subject"] or ""),
                        "run_marker": message["run_marker"],
                        "bare_lf": bool(message.get("bare_lf")),
                    }
                    if message
                    else None
                ),
                "receipt": views.receipt_view(receipt) if receipt else None,
                "dead_letter": _dead_letter_summary(dl) if dl else None,
                "cancellation": (
                    {"reason": r["cancel_reason"], "cancelled_at": views.iso(r["cancelled_at"])}
                    if status is Status.CANCELLED
                    else None
                ),
            }
        )
    return {
        "run_id": run_id,
        "generated_at": views.iso(generated_at),
        "summary": {"signals": len(signals), "by_status": by_status},
        "signals": signals,
    }


def _expectation(row: Any, status: Status) -> dict[str, Any]:
    """What the signal asserted and whether it held: for `none`, `held` is
    True once `absent` (with the final look that saw none, begun at or after
    the deadline), False once `arrived`; None while undecided or for the others
    until they are found."""
    held: bool | None = None
    if row["expect"] == "none":
        held = True if status is Status.ABSENT else False if status is Status.ARRIVED else None
    elif status in (Status.FOUND, Status.CLAIMED, Status.CONSUMED):
        held = True
    elif status is Status.EXPIRED:
        held = False
    return {
        "expect": row["expect"],
        "settle_seconds": row["settle_seconds"],
        "held": held,
        "final_look_at": views.iso(row["last_look_at"]) if status is Status.ABSENT else None,
    }


def _dead_letter_summary(row: Any) -> dict[str, Any]:
    view = views.dead_letter_view(row)
    view.pop("note", None)
    # A recipient typo's recommendation and near miss name addresses: here
    # they appear as recipient hashes, like every recipient of the evidence.
    if view.get("recommendation"):
        view["recommendation"] = PLAIN_ADDRESS_RE.sub(
            lambda m: "recipient " + recipient_hash(m.group(0)), view["recommendation"]
        )
    view["near_misses"] = [_hashed_address(n) for n in view.get("near_misses") or []]
    return view


def _hashed_address(near: Any) -> Any:
    if isinstance(near, dict) and near.get("address"):
        out = {k: v for k, v in near.items() if k != "address"}
        out["address_hash"] = recipient_hash(str(near["address"]))
        return out
    return near
