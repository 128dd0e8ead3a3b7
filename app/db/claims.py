"""Repository of claims and receipts: every SQL statement that touches them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import RowMapping, bindparam, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from app.db.repository import affected
from app.domain.states import CLAIM, CONSUME, GIVE_BACK


def signal_take_for_claim(
    session: Session, signal_id: str, *, lease_seconds: float
) -> RowMapping | None:
    """found → claimed in one guarded statement: bumps the claim fence and
    the claims used. None if the signal was not `found` (someone moved first)
    or has no claim left."""
    return (
        session.execute(
            text(
                """
                UPDATE signals
                   SET status = :dst, claim_fence = claim_fence + 1,
                       claims_used = claims_used + 1, updated_at = now()
                 WHERE id = :id AND status = :src AND claims_used < max_claims
                 RETURNING *, now() AS now, now() + make_interval(secs => :lease) AS lease_until
                """
            ),
            {"id": signal_id, "lease": lease_seconds, **CLAIM.params},
        )
        .mappings()
        .first()
    )


def claim_insert(session: Session, values: Mapping[Any, Any]) -> RowMapping:
    return (
        session.execute(
            text(
                """
                INSERT INTO claims
                    (id, signal_id, fence, run_id, message_id, claimed_at, lease_until)
                VALUES (:id, :signal_id, :fence, :run_id, :message_id, :claimed_at, :lease_until)
                RETURNING *
                """
            ),
            dict(values),
        )
        .mappings()
        .one()
    )


def claim_get(session: Session, claim_id: str) -> RowMapping | None:
    return (
        session.execute(text("SELECT * FROM claims WHERE id = :id"), {"id": claim_id})
        .mappings()
        .first()
    )


def claim_active_for_signal(session: Session, signal_id: str) -> RowMapping | None:
    return (
        session.execute(
            text("SELECT * FROM claims WHERE signal_id = :id AND state = 'active'"),
            {"id": signal_id},
        )
        .mappings()
        .first()
    )


def claim_active_many(session: Session, signal_ids: Sequence[str]) -> dict[str, RowMapping]:
    rows = (
        session.execute(
            text("SELECT * FROM claims WHERE signal_id = ANY(:ids) AND state = 'active'"),
            {"ids": list(signal_ids)},
        )
        .mappings()
        .all()
    )
    return {r["signal_id"]: r for r in rows}


def claim_lock_live(session: Session, claim_id: str) -> RowMapping | None:
    """The claim and its signal, locked, if the claim is active, its lease has
    not lapsed, and its fence is still the signal's (fencing)."""
    return (
        session.execute(
            text(
                """
                SELECT c.*, s.namespace, s.claim_fence, s.status AS signal_status,
                       c.lease_until > now() AS live, now() AS now
                  FROM claims c JOIN signals s ON s.id = c.signal_id
                 WHERE c.id = :id
                 FOR UPDATE OF c, s
                """
            ),
            {"id": claim_id},
        )
        .mappings()
        .first()
    )


def claim_end(session: Session, claim_id: str, fence: int, *, to_state: str) -> bool:
    return (
        affected(
            session.execute(
                text(
                    "UPDATE claims SET state = :to, ended_at = now()"
                    " WHERE id = :id AND fence = :fence AND state = 'active'"
                ),
                {"id": claim_id, "fence": fence, "to": to_state},
            )
        )
        == 1
    )


def claim_extend(
    session: Session, claim_id: str, fence: int, lease_seconds: float
) -> RowMapping | None:
    return (
        session.execute(
            text(
                "UPDATE claims SET lease_until = now() + make_interval(secs => :lease)"
                " WHERE id = :id AND fence = :fence AND state = 'active' AND lease_until > now()"
                " RETURNING *"
            ),
            {"id": claim_id, "fence": fence, "lease": lease_seconds},
        )
        .mappings()
        .first()
    )


def signal_release_claim(session: Session, signal_id: str, fence: int) -> bool:
    """claimed → found, if `fence` is still the signal's claim fence."""
    return (
        affected(
            session.execute(
                text(
                    "UPDATE signals SET status = :dst, updated_at = now()"
                    " WHERE id = :id AND status = :src AND claim_fence = :fence"
                ),
                {"id": signal_id, "fence": fence, **GIVE_BACK.params},
            )
        )
        == 1
    )


def signal_mark_consumed(session: Session, signal_id: str, fence: int) -> bool:
    return (
        affected(
            session.execute(
                text(
                    "UPDATE signals SET status = :dst, updated_at = now()"
                    " WHERE id = :id AND status = :src AND claim_fence = :fence"
                ),
                {"id": signal_id, "fence": fence, **CONSUME.params},
            )
        )
        == 1
    )


def claim_lapsed_ids(session: Session, limit: int) -> list[str]:
    return list(
        session.execute(
            text(
                "SELECT id FROM claims WHERE state = 'active' AND lease_until <= now()"
                " ORDER BY lease_until LIMIT :limit FOR UPDATE SKIP LOCKED"
            ),
            {"limit": limit},
        ).scalars()
    )


def receipt_insert(session: Session, values: Mapping[Any, Any]) -> RowMapping:
    return (
        session.execute(
            text(
                """
                INSERT INTO receipts (id, signal_id, claim_id, namespace, run_id, message_id,
                                      claimed_at, evidence)
                VALUES (:id, :signal_id, :claim_id, :namespace, :run_id, :message_id,
                        :claimed_at, :evidence)
                RETURNING *
                """
            ).bindparams(bindparam("evidence", type_=JSONB)),
            dict(values),
        )
        .mappings()
        .one()
    )


def receipt_by_signal_many(session: Session, signal_ids: Sequence[str]) -> dict[str, RowMapping]:
    rows = (
        session.execute(
            text("SELECT * FROM receipts WHERE signal_id = ANY(:ids)"), {"ids": list(signal_ids)}
        )
        .mappings()
        .all()
    )
    return {r["signal_id"]: r for r in rows}


def receipt_by_claim(session: Session, claim_id: str) -> RowMapping | None:
    return (
        session.execute(text("SELECT * FROM receipts WHERE claim_id = :id"), {"id": claim_id})
        .mappings()
        .first()
    )


def claim_latest_many(session: Session, signal_ids: Sequence[str]) -> dict[str, RowMapping]:
    """The latest claim of each signal (for evidence timings)."""
    rows = (
        session.execute(
            text(
                "SELECT DISTINCT ON (signal_id) * FROM claims WHERE signal_id = ANY(:ids)"
                " ORDER BY signal_id, fence DESC"
            ),
            {"ids": list(signal_ids)},
        )
        .mappings()
        .all()
    )
    return {r["signal_id"]: r for r in rows}
