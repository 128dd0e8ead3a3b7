"""Repository of observed messages (`messages`) and near misses (`near_misses`).

A message seen at a provider is recorded once (unique on provider and the
provider's id); a near miss is a message addressed to a signal's recipient
that did not match it, with why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import RowMapping, text
from sqlalchemy.orm import Session

from app.db import raw
from app.db.rows import Row, affected, by_column, every, first


def message_record_many(session: Session, rows: Sequence[Mapping[Any, Any]]) -> int:
    """Record observed messages once each (unique on provider and the
    provider's id); returns how many were new."""
    if not rows:
        return 0
    result = session.execute(
        text(
            """
            INSERT INTO messages (id, provider, provider_message_id, received_at, subject,
                                  recipients, run_marker, size, bare_lf, raw)
            VALUES (:id, :provider, :provider_message_id, :received_at, :subject,
                    :recipients, :run_marker, :size, :bare_lf, :raw)
            ON CONFLICT (provider, provider_message_id) DO NOTHING
            """
        ),
        [{"bare_lf": False, **r} for r in rows],
    )
    return affected(result)


def message_record_new(
    session: Session, provider: str, rows: Sequence[Mapping[Any, Any]]
) -> dict[str, str]:
    """Record the observed messages not recorded yet, once each, and return
    provider id → our id for all of `rows`.

    Raw bytes already stored are never sent again: the known ids are read
    first. New rows are inserted in provider-id order, the one order every
    check inserts in, so two checks recording overlapping mail never
    deadlock on the unique index.
    """
    if not rows:
        return {}
    ids = message_ids_by_provider_id(session, provider, [r["provider_message_id"] for r in rows])
    new = sorted(
        (r for r in rows if r["provider_message_id"] not in ids),
        key=lambda r: str(r["provider_message_id"]),
    )
    if new:
        message_record_many(session, new)
        ids.update(
            message_ids_by_provider_id(session, provider, [r["provider_message_id"] for r in new])
        )
    return ids


_IDS_BY_PROVIDER_ID = raw.Query(
    "SELECT provider_message_id, id FROM messages"
    " WHERE provider = :p AND provider_message_id = ANY(:ids)"
)
_TAKEN = raw.Query(
    "SELECT message_id, id FROM signals WHERE namespace = :ns AND message_id = ANY(:ids)"
)
_NEAR_MISSES = raw.Query(
    """
    INSERT INTO near_misses (signal_id, message_id, why)
    SELECT :s, m, w FROM unnest(CAST(:mids AS text[]), CAST(:whys AS text[])) AS t(m, w)
    ON CONFLICT DO NOTHING
    RETURNING why
    """
)


def message_ids_by_provider_id(
    session: Session, provider: str, provider_ids: Sequence[str]
) -> dict[str, str]:
    rows = raw.rows(session, _IDS_BY_PROVIDER_ID, {"p": provider, "ids": list(provider_ids)})
    return {r["provider_message_id"]: r["id"] for r in rows}


def message_taken(session: Session, message_ids: Sequence[str], namespace: str) -> dict[str, str]:
    """message id → the signal of `namespace` that already has it (another
    namespace's signal never hides a message from this one)."""
    rows = raw.rows(session, _TAKEN, {"ids": list(message_ids), "ns": namespace})
    return {r["message_id"]: r["id"] for r in rows}


def message_get_many(session: Session, message_ids: Sequence[str]) -> dict[str, RowMapping]:
    return by_column(
        session,
        "SELECT id, provider, provider_message_id, received_at, subject, recipients,"
        " run_marker, size, bare_lf FROM messages WHERE id = ANY(:ids)",
        {"ids": list(message_ids)},
        "id",
    )


def message_with_raw(session: Session, message_id: str) -> Row | None:
    """One message's summary and its raw bytes (None once purged), in one statement."""
    return first(
        session,
        "SELECT id, provider, provider_message_id, received_at, subject, recipients,"
        " run_marker, size, raw FROM messages WHERE id = :id",
        {"id": message_id},
    )


def near_miss_record_many(
    session: Session, signal_id: str, misses: Sequence[tuple[str, str]]
) -> list[str]:
    """Record (message id, why) near misses of a signal in one statement;
    return the `why` of each one that was new."""
    if not misses:
        return []
    rows = raw.rows(
        session,
        _NEAR_MISSES,
        {"s": signal_id, "mids": [m for m, _ in misses], "whys": [w for _, w in misses]},
    )
    return [r["why"] for r in rows]


def near_miss_list(session: Session, signal_id: str) -> Sequence[Row]:
    return every(
        session,
        """
                SELECT n.message_id, n.why, m.received_at, m.subject, m.run_marker
                  FROM near_misses n JOIN messages m ON m.id = n.message_id
                 WHERE n.signal_id = :id
                 ORDER BY m.received_at
        """,
        {"id": signal_id},
    )
