"""Repository of claims (`claims`) and their receipts (`receipts`).

A claim moves its signal found → claimed and back, or on to consumed, each
step one statement guarded by the signal's claim fence; the claim's lease
lapses unless extended, and a consume writes the receipt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from psycopg.types.json import Jsonb
from sqlalchemy import Connection

from app.db import runner
from app.db.records import ClaimRow, ReceiptRow
from app.db.runner import Statement
from app.domain.states import CLAIM, CONSUME, GIVE_BACK

_CLAIM_TAKE: Statement = Statement(
    "claim_take",
    """
                WITH seen AS (
                    SELECT s.run_id = :run_id AS run_matches, s.status, s.expect,
                           s.message_id IS NOT NULL AS has_message,
                           s.claims_used < s.max_claims AS claims_left,
                           a.id AS lapsed_claim_id, a.fence AS lapsed_fence
                      FROM signals s
                      LEFT JOIN claims a ON a.signal_id = s.id AND a.state = 'active'
                                        AND a.lease_until <= now()
                     WHERE s.id = :id AND s.namespace = :namespace
                ), taken AS (
                    UPDATE signals
                       SET status = :dst, claim_fence = claim_fence + 1,
                           claims_used = claims_used + 1, updated_at = now()
                     WHERE id = :id AND namespace = :namespace AND run_id = :run_id
                       AND status = :src AND claims_used < max_claims
                       AND message_id IS NOT NULL
                     RETURNING id, run_id, recipient, message_id, claim_fence,
                               max_claims, claims_used,
                               now() + make_interval(secs => :lease) AS lease_until
                ), claim AS (
                    INSERT INTO claims
                        (id, signal_id, fence, run_id, message_id, claimed_at, lease_until, owner)
                    SELECT :claim_id, id, claim_fence, run_id, message_id, now(), lease_until,
                           :owner
                      FROM taken
                    RETURNING id, lease_until, owner
                ), took AS (
                    SELECT t.id AS signal_id, t.run_id, t.recipient, t.max_claims,
                           t.claims_used, c.id AS claim_id, c.lease_until, c.owner,
                           m.id AS message_id, m.subject, m.received_at, m.raw
                      FROM taken t CROSS JOIN claim c
                      LEFT JOIN messages m ON m.id = t.message_id
                )
                SELECT took.*, seen.status IS NOT NULL AS seen_exists,
                       seen.run_matches AS seen_run_matches, seen.status AS seen_status,
                       seen.expect AS seen_expect, seen.has_message AS seen_has_message,
                       seen.claims_left AS seen_claims_left,
                       seen.lapsed_claim_id, seen.lapsed_fence
                  FROM (SELECT 1) AS one
                  LEFT JOIN seen ON true
                  LEFT JOIN took ON true
""",
)


def claim_take(
    session: Connection,
    signal_id: str,
    namespace: str,
    *,
    run_id: str,
    claim_id: str,
    lease_seconds: float,
    owner: str | None = None,
) -> dict[str, Any]:
    """found → claimed, the claim row (held by `owner`) and the claimed
    message, in one statement; one row always.

    The guarded UPDATE bumps the claim fence and the claims used; the claim is
    inserted from what it returned, and the message (raw bytes included, None
    once purged) read with it. `claim_id` is NULL when it took nothing: the
    signal is not this namespace's and run's, not `found` (someone moved
    first), has no claim left or no message (deleted by hand). The row then
    holds the facts the statement saw (`seen_*`: whether the signal exists,
    its run matches, its status, expect, whether it has a message and claims
    left; `lapsed_claim_id` and `lapsed_fence`: its active claim whose lease
    has lapsed), for `app.domain.claiming.claim_refusal` to decide on.
    Taking nothing it writes nothing, so it may run committed on its own."""
    row = runner.one(
        session,
        _CLAIM_TAKE,
        {
            "id": signal_id,
            "namespace": namespace,
            "run_id": run_id,
            "claim_id": claim_id,
            "lease": lease_seconds,
            "owner": owner,
            **CLAIM.params,
        },
        binary=True,  # the raw bytes cross once, not as hex twice their size
    )
    assert row is not None  # one row always
    return row


_GET: Statement[ClaimRow] = Statement("claim_get", "SELECT * FROM claims WHERE id = :id")


def claim_get(session: Connection, claim_id: str) -> ClaimRow | None:
    return runner.one(session, _GET, {"id": claim_id})


# A claim as `claim_lock_live` reads it, unlocked, with its message's bytes.
_CLAIM_COLUMNS = """
                SELECT c.*, s.namespace, s.claim_fence, s.status AS signal_status,
                       c.lease_until > now() AS live, now() AS now,
                       s.recipient, s.provider, s.subject_contains, s.body_contains,
                       s.received_after, m.run_marker, m.received_at AS message_received_at"""
_CLAIM_MESSAGE_RAW: Statement = Statement(
    "claim_message_raw",
    _CLAIM_COLUMNS
    + """, m.raw
                  FROM claims c JOIN signals s ON s.id = c.signal_id
                  LEFT JOIN messages m ON m.id = c.message_id
                 WHERE c.id = :id
""",
)


def claim_message_raw(session: Connection, claim_id: str) -> dict[str, Any] | None:
    """A claim as :func:`claim_lock_live` reads it and its message's raw bytes
    (None once purged), unlocked, in one round trip and in binary format
    (what a consume hashes before it locks anything, or consumes from)."""
    return runner.one(session, _CLAIM_MESSAGE_RAW, {"id": claim_id}, binary=True)


_ACTIVE_FOR_SIGNAL: Statement[ClaimRow] = Statement(
    "claim_active_for_signal", "SELECT * FROM claims WHERE signal_id = :id AND state = 'active'"
)


def claim_active_for_signal(session: Connection, signal_id: str) -> ClaimRow | None:
    return runner.one(session, _ACTIVE_FOR_SIGNAL, {"id": signal_id})


_ACTIVE_MANY: Statement[ClaimRow] = Statement(
    "claim_active_many", "SELECT * FROM claims WHERE signal_id = ANY(:ids) AND state = 'active'"
)


def claim_active_many(session: Connection, signal_ids: Sequence[str]) -> dict[str, ClaimRow]:
    return _by_signal(runner.all(session, _ACTIVE_MANY, {"ids": list(signal_ids)}))


_Keyed = TypeVar("_Keyed", ClaimRow, ReceiptRow)


def _by_signal(rows: list[_Keyed]) -> dict[str, _Keyed]:
    """The rows keyed by `signal_id` (the last row wins a repeat)."""
    return {r["signal_id"]: r for r in rows}


_CLAIM_LOCK_LIVE: Statement = Statement(
    "claim_lock_live",
    _CLAIM_COLUMNS
    + """
                  FROM claims c JOIN signals s ON s.id = c.signal_id
                  LEFT JOIN messages m ON m.id = c.message_id
                 WHERE c.id = :id
                 FOR UPDATE OF c, s
""",
)


def claim_lock_live(session: Connection, claim_id: str) -> dict[str, Any] | None:
    """The claim and its signal, locked, with what a receipt's evidence needs
    of the signal and the message. ``live``: the lease has not lapsed."""
    return runner.one(session, _CLAIM_LOCK_LIVE, {"id": claim_id})


_END: Statement = Statement(
    "claim_end",
    "UPDATE claims SET state = :to, ended_at = now()"
    " WHERE id = :id AND fence = :fence AND state = 'active'",
)


def claim_end(session: Connection, claim_id: str, fence: int, *, to_state: str) -> bool:
    params = {"id": claim_id, "fence": fence, "to": to_state}
    return runner.exec(session, _END, params) == 1


_EXTEND: Statement[ClaimRow] = Statement(
    "claim_extend",
    "UPDATE claims SET lease_until = now() + make_interval(secs => :lease)"
    " WHERE id = :id AND fence = :fence AND state = 'active' AND lease_until > now()"
    " RETURNING *",
)


def claim_extend(
    session: Connection, claim_id: str, fence: int, lease_seconds: float
) -> ClaimRow | None:
    params = {"id": claim_id, "fence": fence, "lease": lease_seconds}
    return runner.one(session, _EXTEND, params)


_RELEASE: Statement = Statement(
    "signal_release_claim",
    "UPDATE signals SET status = :dst, updated_at = now()"
    " WHERE id = :id AND status = :src AND claim_fence = :fence",
)


def signal_release_claim(session: Connection, signal_id: str, fence: int) -> bool:
    """claimed → found, if `fence` is still the signal's claim fence."""
    params = {"id": signal_id, "fence": fence, **GIVE_BACK.params}
    return runner.exec(session, _RELEASE, params) == 1


_CLAIM_CONSUME: Statement = Statement(
    "claim_consume",
    """
                WITH seen AS (
                    SELECT c.state AS seen_state, c.lease_until > now() AS seen_live,
                           c.fence = s.claim_fence AS seen_current
                      FROM claims c JOIN signals s ON s.id = c.signal_id
                     WHERE c.id = :claim_id
                ), ended AS (
                    UPDATE claims SET state = 'consumed', ended_at = now()
                     WHERE id = :claim_id AND fence = :fence AND state = 'active'
                       AND lease_until > now()
                       AND EXISTS (SELECT 1 FROM signals
                                    WHERE id = :signal_id AND status = :src
                                      AND claim_fence = :fence)
                     RETURNING id, claimed_at, message_id, owner
                ), sig AS (
                    UPDATE signals SET status = :dst, updated_at = now()
                     WHERE id = :signal_id AND status = :src AND claim_fence = :fence
                       AND EXISTS (SELECT 1 FROM ended)
                     RETURNING id, run_id
                ), receipt AS (
                    INSERT INTO receipts (id, signal_id, claim_id, namespace, run_id, message_id,
                                          claimed_at, evidence, owner)
                    SELECT :id, sig.id, ended.id, :namespace, sig.run_id, ended.message_id,
                           ended.claimed_at, :evidence, ended.owner
                      FROM sig CROSS JOIN ended
                    RETURNING *
                )
                SELECT r.*, seen.* FROM (SELECT 1) AS one
                  LEFT JOIN seen ON true LEFT JOIN receipt r ON true
""",
)


def claim_consume(
    session: Connection, claim: Mapping[Any, Any], receipt: Mapping[str, Any]
) -> dict[str, Any]:
    """claimed → consumed, the claim ended and its receipt written, in one
    statement, guarded by the claim's fence, its live lease and the signal
    still claimed under that fence. ``claim`` is a row of
    :func:`claim_lock_live` (both rows locked) or, committed on its own, of
    :func:`claim_message_raw`: the claim is ended first (its row locked) and
    the signal moved only if it was, so a guard that fails on either row
    writes nothing (a writer that ends the claim also moves the signal, and
    must wait for the claim's lock). ``receipt`` holds the receipt's id and
    evidence. One row always: the receipt's (`id` NULL when a guard failed
    and nothing was written), with the facts the guards saw of the claim
    (`seen_state`, `seen_live`: its lease, `seen_current`: its fence is the
    signal's) for `app.domain.claiming.consume_refusal`."""
    row = runner.one(
        session,
        _CLAIM_CONSUME,
        {
            "id": receipt["id"],
            "evidence": Jsonb(receipt["evidence"]),
            "signal_id": claim["signal_id"],
            "claim_id": claim["id"],
            "fence": claim["fence"],
            "namespace": claim["namespace"],
            **CONSUME.params,
        },
    )
    assert row is not None  # one row always
    return row


_LAPSED_IDS: Statement = Statement(
    "claim_lapsed_ids",
    "SELECT id FROM claims WHERE state = 'active' AND lease_until <= now()"
    " ORDER BY lease_until LIMIT :limit FOR UPDATE SKIP LOCKED",
)


def claim_lapsed_ids(session: Connection, limit: int) -> list[str]:
    return [r["id"] for r in runner.all(session, _LAPSED_IDS, {"limit": limit})]


_RECEIPT_BY_SIGNAL_MANY: Statement[ReceiptRow] = Statement(
    "receipt_by_signal_many", "SELECT * FROM receipts WHERE signal_id = ANY(:ids)"
)


def receipt_by_signal_many(session: Connection, signal_ids: Sequence[str]) -> dict[str, ReceiptRow]:
    return _by_signal(runner.all(session, _RECEIPT_BY_SIGNAL_MANY, {"ids": list(signal_ids)}))


_RECEIPT_BY_CLAIM: Statement[ReceiptRow] = Statement(
    "receipt_by_claim", "SELECT * FROM receipts WHERE claim_id = :id"
)


def receipt_by_claim(session: Connection, claim_id: str) -> ReceiptRow | None:
    return runner.one(session, _RECEIPT_BY_CLAIM, {"id": claim_id})


_LATEST_MANY: Statement[ClaimRow] = Statement(
    "claim_latest_many",
    "SELECT DISTINCT ON (signal_id) * FROM claims WHERE signal_id = ANY(:ids)"
    " ORDER BY signal_id, fence DESC",
)


def claim_latest_many(session: Connection, signal_ids: Sequence[str]) -> dict[str, ClaimRow]:
    """The latest claim of each signal (for evidence timings)."""
    return _by_signal(runner.all(session, _LATEST_MANY, {"ids": list(signal_ids)}))


_LIST_FOR_SIGNAL: Statement[ClaimRow] = Statement(
    "claim_list_for_signal",
    "SELECT * FROM claims WHERE signal_id = :id ORDER BY claimed_at, id LIMIT :limit",
)


def claim_list_for_signal(session: Connection, signal_id: str, limit: int = 500) -> list[ClaimRow]:
    """Every claim of the signal, oldest first (its timeline)."""
    return runner.all(session, _LIST_FOR_SIGNAL, {"id": signal_id, "limit": limit})
