"""Use cases of claims: claim, consume, release, extend, and lapsing leases.

A claim is one guarded transition (found → claimed) that bumps the signal's
claim fence. Consume, release and extend hold only if the claim is active,
its lease is live, and its fence is still the signal's: a holder whose lease
lapsed can never act, even a millisecond after another consumer claimed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import OperationalError

from app.db import claims as claims_db
from app.db import messages as messages_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db.engine import autocommit, retryable, transaction
from app.domain import whole_message
from app.domain.claiming import (
    ClaimFacts,
    ClaimOutcome,
    ConsumeRefusal,
    Refusal,
    claim_refusal,
    consume_refusal,
)
from app.domain.expectations import Expect
from app.domain.ids import new_id
from app.domain.masking import mask_subject
from app.domain.states import ExpiryReason, Status
from app.errors import LeaseExpired, NotFound
from app.infra.keys import recipient_hash
from app.observability import metrics
from app.observability.logs import signal_extra
from app.usecases import views
from app.usecases.claim_answers import Answer, refused
from app.usecases.expiry import expire_signal, publish
from app.usecases.inputs import ClaimCreate, ClaimExtend

log = logging.getLogger("signalbox.claims")


# Times the claim statement runs when another writer moved first (or a
# lapsed lease was ended) before it is answered as refused.
CLAIM_ATTEMPTS = 3


def _give_back(
    session: Connection, claim: Mapping[Any, Any], signal: Mapping[Any, Any]
) -> str | None:
    """After a claim ended unconsumed (released or lapsed): the signal goes
    back to `found` while claims are left, else expires with
    `claims_exhausted`. Every claim spends one of `max_claims`, whatever its
    end. Returns a new dead letter id."""
    if signal["claims_used"] >= signal["max_claims"]:
        return expire_signal(
            session, signal["id"], expected=Status.CLAIMED, reason=ExpiryReason.CLAIMS_EXHAUSTED
        )
    claims_db.signal_release_claim(session, signal["id"], claim["fence"])
    return None


def _lapse(session: Connection, claim: Mapping[Any, Any], signal: Mapping[Any, Any]) -> str | None:
    """End a lapsed claim and give the message back (or expire the signal).
    Returns a new dead letter id."""
    if not claims_db.claim_end(session, claim["id"], claim["fence"], to_state="lapsed"):
        return None
    metrics.lease_lapsed(signal["namespace"])
    _log_claim_event("claim lease lapsed", "lease_lapsed", claim["id"], signal["id"], signal)
    return _give_back(session, claim, signal)


def lapse_leases(limit: int = 500) -> int:
    """Lapse every expired lease (run by the sweep, so no API call is needed)."""
    dead: list[str] = []
    lapsed = 0
    with transaction() as session:
        for claim_id in claims_db.claim_lapsed_ids(session, limit):
            claim = claims_db.claim_get(session, claim_id)
            signal = signals_db.signal_get(session, claim["signal_id"]) if claim else None
            if claim is None or signal is None:
                continue
            lapsed += 1
            dlq = _lapse(session, claim, signal)
            if dlq:
                dead.append(dlq)
    publish(dead)
    return lapsed


def claim(namespace: str, signal_id: str, req: ClaimCreate) -> Answer:
    """Lease a found signal's message to `req.owner` (default: the token's
    name, which for a tenant's token is its namespace).

    One statement, committed alone, takes it; when it takes nothing it
    wrote nothing and says what it saw, and `claim_refusal` decides. A
    lease that lapsed (the sweep has not ended it yet) is ended, and the
    same statement runs again, as it does when another writer moved first."""
    dead: list[str] = []
    refusal = Refusal.ALREADY_CLAIMED
    for attempt in range(1, CLAIM_ATTEMPTS + 1):
        with autocommit() as session:
            row = _take(session, signal_id, namespace, req)
        if row["claim_id"] is not None:
            publish(dead)
            # Parsed for its content once committed: no lock is held meanwhile.
            return _claimed(row)
        refusal = claim_refusal(_claim_facts(row))
        if refusal is Refusal.LEASE_LAPSED:
            dead += _lapse_seen(namespace, signal_id, row)
        if refusal not in (Refusal.LEASE_LAPSED, Refusal.RACED):
            break
        if attempt == CLAIM_ATTEMPTS:
            refusal = Refusal.ALREADY_CLAIMED
    publish(dead)
    return refused(namespace, signal_id, refusal)


def _claim_facts(row: Mapping[Any, Any]) -> ClaimFacts:
    """The facts the claim statement returned when it took nothing."""
    if not row["seen_exists"]:
        return ClaimFacts(exists=False)
    return ClaimFacts(
        exists=True,
        run_matches=bool(row["seen_run_matches"]),
        status=Status(row["seen_status"]),
        expect=Expect(row["seen_expect"]),
        has_message=bool(row["seen_has_message"]),
        claims_left=bool(row["seen_claims_left"]),
        lease_lapsed=row["lapsed_claim_id"] is not None,
    )


def _lapse_seen(namespace: str, signal_id: str, row: Mapping[Any, Any]) -> list[str]:
    """End the lapsed claim the statement saw (guarded by its fence and its
    state, so a claim another writer ended meanwhile is left alone) and give
    its message back; the new dead letter ids."""
    with transaction() as session:
        signal = signals_db.signal_get(session, signal_id, namespace)
        if signal is None:
            return []
        lapsed = {"id": row["lapsed_claim_id"], "fence": row["lapsed_fence"]}
        dlq = _lapse(session, lapsed, signal)
    return [dlq] if dlq else []


def _take(session: Connection, signal_id: str, namespace: str, req: ClaimCreate) -> dict[str, Any]:
    taken = claims_db.claim_take(
        session,
        signal_id,
        namespace,
        run_id=req.run_id,
        claim_id=new_id("clm"),
        lease_seconds=float(req.lease_seconds),
        owner=req.owner or namespace,
    )
    if taken["claim_id"] is not None and taken["message_id"] is None:
        # A claimed message outlives its signal's claims (foreign key): only
        # a hand-made deletion gets here.
        raise NotFound(f"no message of signal {signal_id}")
    return taken


def _message_of(session: Connection, message_id: str) -> Mapping[Any, Any]:
    message = messages_db.message_with_raw(session, message_id)
    if message is None:  # a claimed message outlives its signal's claims (foreign key)
        raise NotFound(f"no message {message_id}")
    return message


def _claim_answer(
    *,
    claim_id: str,
    signal_id: str,
    lease_until: Any,
    claims_left: int,
    message: Mapping[Any, Any],
    owner: str | None,
) -> Answer:
    """The 200 of a live claim, content included (the same for the claim and
    for reading it again)."""
    raw = bytes(message["raw"]) if message["raw"] is not None else None
    # The linear scan, not the stdlib's tree: a 25 MiB message costs little
    # more than its bytes (docs/api.md, "Large messages").
    content = whole_message.claim_content(raw) if raw is not None else None
    return Answer(
        ClaimOutcome.CLAIMED,
        {
            "status": "claimed",
            "claim_id": claim_id,
            "signal_id": signal_id,
            "message_id": message["id"],
            "lease_until": views.iso(lease_until),
            "owner": owner,
            "claims_left": max(0, claims_left),
            "subject": message["subject"],
            "received_at": views.iso(message["received_at"]),
            "body_excerpt": content.body_excerpt if content else "",
            "links": list(content.links) if content else [],
            "codes": list(content.codes) if content else [],
            "content_purged": raw is None,
        },
    )


def _claimed(taken: Mapping[Any, Any]) -> Answer:
    _log_claim_event(
        "signal claimed", "signal_claimed", taken["claim_id"], taken["signal_id"], taken
    )
    return _claim_answer(
        claim_id=taken["claim_id"],
        signal_id=taken["signal_id"],
        lease_until=taken["lease_until"],
        claims_left=taken["max_claims"] - taken["claims_used"],
        owner=taken["owner"],
        message={
            "id": taken["message_id"],
            "subject": taken["subject"],
            "received_at": taken["received_at"],
            "raw": taken["raw"],
        },
    )


def _live_claim(session: Connection, namespace: str, claim_id: str) -> Mapping[Any, Any]:
    claim_row = claims_db.claim_lock_live(session, claim_id)
    if claim_row is None or claim_row["namespace"] != namespace:
        raise NotFound(f"no claim {claim_id}")
    return claim_row


def _require_live(claim_row: Mapping[Any, Any]) -> None:
    if (
        claim_row["state"] != "active"
        or not claim_row["live"]
        or claim_row["fence"] != claim_row["claim_fence"]
    ):
        raise LeaseExpired(
            "this claim's lease lapsed or it was ended; claim the signal again",
            claim_id=claim_row["id"],
        )


def consume(namespace: str, claim_id: str) -> dict[str, Any]:
    """Consume the claimed message; consuming again returns the same receipt.

    Two statements committed alone: the claim and its message read unlocked
    (hashing a large message holds no lock), then the consume, guarded by
    the fence, the state and the lease. When a guard fails it writes
    nothing and says what it saw, and `consume_refusal` decides: the kept
    receipt, LeaseExpired, or the same statement again (a concurrent writer
    held the rows, or PostgreSQL aborted it for a deadlock)."""
    with autocommit() as session:  # one connection for every statement
        unlocked = claims_db.claim_message_raw(session, claim_id)
        if unlocked is None or unlocked["namespace"] != namespace:
            raise NotFound(f"no claim {claim_id}")
        pinned: dict[str, Any] = {}
        if unlocked["state"] == "active":  # the evidence of a claim that can be consumed
            pinned = _message_digest(unlocked["raw"], unlocked["message_id"])
        for _ in range(CLAIM_ATTEMPTS):
            try:
                row = _consume_row(session, unlocked, pinned)
            except OperationalError as exc:
                # Aborted for a deadlock or a lock wait (with a release or a
                # lapse at the same moment): nothing was written.
                if not retryable(exc):
                    raise
                continue
            if row["id"] is not None:
                return views.receipt_view(row)
            refusal = consume_refusal(row["seen_state"], row["seen_live"], row["seen_current"])
            if refusal is ConsumeRefusal.CONSUMED:
                kept = claims_db.receipt_by_claim(session, claim_id)
                assert kept is not None
                return views.receipt_view(kept)
            if refusal is ConsumeRefusal.LAPSED:
                raise LeaseExpired(
                    "this claim's lease lapsed or it was ended; claim the signal again",
                    claim_id=claim_id,
                )
    raise LeaseExpired(claim_id=claim_id)


def _consume_row(
    session: Connection, claim_row: Mapping[Any, Any], pinned: dict[str, Any]
) -> Mapping[Any, Any]:
    """The consume's one statement: its row (the receipt's columns, `id`
    NULL when a guard failed, and the facts the guards saw)."""
    row = claims_db.claim_consume(
        session,
        claim_row,
        {"id": new_id("rcp"), "evidence": {**_evidence(claim_row), **pinned}},
    )
    if row["id"] is not None:
        _log_claim_event(
            "signal consumed", "signal_consumed", claim_row["id"], claim_row["signal_id"], claim_row
        )
    return row


def _log_claim_event(
    message: str, event: str, claim_id: str, signal_id: str, row: Mapping[Any, Any]
) -> None:
    """One line of a claim's life (claimed, consumed, lapsed): `row` holds
    the signal's `run_id` and `recipient` (logged only as its hash)."""
    extra = signal_extra(event, row["run_id"], signal_id, row["recipient"], claim_id=claim_id)
    log.info(message, extra=extra)


def _evidence(claim_row: Mapping[Any, Any]) -> dict[str, Any]:
    """Why the message belongs to the run: every rule the matcher checked.
    ``claim_row`` is a row of ``claims_db.claim_lock_live``."""
    return {
        "claim_id": claim_row["id"],
        "recipient": "matched",
        "recipient_hash": recipient_hash(claim_row["recipient"]),
        "subject": "matched" if claim_row["subject_contains"] else "not_filtered",
        "body": "matched" if claim_row["body_contains"] else "not_filtered",
        "run_marker": "matched" if claim_row["run_marker"] else "absent",
        "received_at": views.iso(claim_row["message_received_at"]),
        "received_after": views.iso(claim_row["received_after"]),
        "provider": claim_row["provider"],
    }


def _message_digest(raw: bytes | None, message_id: str) -> dict[str, Any]:
    """`message_sha256` and `attachments` for the evidence: hashes, types,
    sizes and masked file names, never content (None and [] once purged)."""
    if raw is None:
        return {"message_sha256": None, "attachments": []}
    pinned = whole_message.digest(bytes(raw), message_id)
    for item in pinned["attachments"]:
        item["filename"] = mask_subject(item["filename"]) if item["filename"] else None
    return pinned


def release(namespace: str, claim_id: str) -> dict[str, Any]:
    """Give the message back: `found` again while claims are left, else the
    signal expires with `claims_exhausted` (a release spends its claim)."""
    with transaction() as session:
        claim_row = _live_claim(session, namespace, claim_id)
        _require_live(claim_row)
        claims_db.claim_end(session, claim_id, claim_row["fence"], to_state="released")
        signal = signals_db.signal_get(session, claim_row["signal_id"])
        assert signal is not None
        dead = _give_back(session, claim_row, signal)
        signal = signals_db.signal_get(session, claim_row["signal_id"])
        assert signal is not None
        view = views.signal_views(session, [signal])[0]
    publish([dead] if dead else [])
    return view


def extend(namespace: str, claim_id: str, req: ClaimExtend) -> dict[str, Any]:
    with transaction() as session:
        claim_row = _live_claim(session, namespace, claim_id)
        _require_live(claim_row)
        row = claims_db.claim_extend(
            session, claim_id, claim_row["fence"], float(req.lease_seconds)
        )
        if row is None:
            raise LeaseExpired(claim_id=claim_id)
        return {
            "status": "claimed",
            "claim_id": claim_id,
            "signal_id": row["signal_id"],
            "message_id": row["message_id"],
            "lease_until": views.iso(row["lease_until"]),
            "owner": row["owner"],
        }


def claim_read(namespace: str, claim_id: str) -> Answer:
    """A claim as its holder got it: while it is active and its lease live,
    the claim's 200 body again (content included), so a consumer that lost
    the answer recovers it without waiting out the lease; once it ended, 410
    with its state (`consumed` with the receipt, `released`, `lapsed`)."""
    with transaction() as session:
        claim_row, signal, ended = claim_live_or_ended(session, namespace, claim_id)
        if ended is not None:
            return ended
        message = _message_of(session, claim_row["message_id"])
    return _claim_answer(
        claim_id=claim_row["id"],
        signal_id=signal["id"],
        lease_until=claim_row["lease_until"],
        claims_left=signal["max_claims"] - signal["claims_used"],
        message=message,
        owner=claim_row["owner"],
    )


def claim_live_or_ended(
    session: Connection, namespace: str, claim_id: str
) -> tuple[Mapping[Any, Any], Mapping[Any, Any], Answer | None]:
    """The claim and its signal, and, once the claim ended (or its lease
    lapsed, or another claim took over), the 410 that says so; NotFound when
    it is not this namespace's. The routes that read a claim's content answer
    only while the third item is None."""
    claim_row = claims_db.claim_get(session, claim_id)
    signal = (
        signals_db.signal_get(session, claim_row["signal_id"], namespace) if claim_row else None
    )
    if claim_row is None or signal is None:
        raise NotFound(f"no claim {claim_id}")
    now = server_db.db_now(session)
    live = (
        claim_row["state"] == "active"
        and claim_row["lease_until"] > now
        and claim_row["fence"] == signal["claim_fence"]
    )
    if live:
        return claim_row, signal, None
    # An active row past its lease is lapsed, whether or not the sweep wrote it yet.
    state = "lapsed" if claim_row["state"] == "active" else claim_row["state"]
    receipt = claims_db.receipt_by_claim(session, claim_id)
    return (
        claim_row,
        signal,
        Answer(
            ClaimOutcome.ENDED,
            {
                "status": state,
                "claim_id": claim_id,
                "signal_id": signal["id"],
                "message_id": claim_row["message_id"],
                "claimed_at": views.iso(claim_row["claimed_at"]),
                "lease_until": views.iso(claim_row["lease_until"]),
                "owner": claim_row["owner"],
                "ended_at": views.iso(claim_row["ended_at"]),
                "receipt": views.receipt_view(receipt) if receipt else None,
            },
        ),
    )
