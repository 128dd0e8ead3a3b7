"""Repository of messages, near misses, the SMTP sink's store and mailboxes.

Every SQL statement that touches `messages`, `near_misses`, `sink_messages`
or `mailboxes` lives here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.db.repository import Row, affected

# ---------------------------------------------------------------- messages


def message_record_many(session: Session, rows: Sequence[Mapping[Any, Any]]) -> int:
    """Record observed messages once each (unique on provider and the
    provider's id); returns how many were new."""
    if not rows:
        return 0
    result = session.execute(
        text(
            """
            INSERT INTO messages (id, provider, provider_message_id, received_at, subject,
                                  recipients, run_marker, size, raw)
            VALUES (:id, :provider, :provider_message_id, :received_at, :subject,
                    :recipients, :run_marker, :size, :raw)
            ON CONFLICT (provider, provider_message_id) DO NOTHING
            """
        ),
        [dict(r) for r in rows],
    )
    return affected(result)


def message_ids_by_provider_id(
    session: Session, provider: str, provider_ids: Sequence[str]
) -> dict[str, str]:
    rows = session.execute(
        text(
            "SELECT provider_message_id, id FROM messages"
            " WHERE provider = :p AND provider_message_id = ANY(:ids)"
        ),
        {"p": provider, "ids": list(provider_ids)},
    ).all()
    return {r[0]: r[1] for r in rows}


def message_taken(session: Session, message_ids: Sequence[str]) -> dict[str, str]:
    """message id → the signal that already has it."""
    rows = session.execute(
        text("SELECT message_id, id FROM signals WHERE message_id = ANY(:ids)"),
        {"ids": list(message_ids)},
    ).all()
    return {r[0]: r[1] for r in rows}


def message_get_many(session: Session, message_ids: Sequence[str]) -> dict[str, Row]:
    rows = (
        session.execute(
            text(
                "SELECT id, provider, provider_message_id, received_at, subject, recipients,"
                " run_marker, size FROM messages WHERE id = ANY(:ids)"
            ),
            {"ids": list(message_ids)},
        )
        .mappings()
        .all()
    )
    return {r["id"]: r for r in rows}


def message_raw(session: Session, message_id: str) -> bytes | None:
    raw = session.execute(
        text("SELECT raw FROM messages WHERE id = :id"), {"id": message_id}
    ).scalar_one_or_none()
    return bytes(raw) if raw is not None else None


def near_miss_record(session: Session, signal_id: str, message_id: str, why: str) -> bool:
    return (
        affected(
            session.execute(
                text(
                    "INSERT INTO near_misses (signal_id, message_id, why) VALUES (:s, :m, :w)"
                    " ON CONFLICT DO NOTHING"
                ),
                {"s": signal_id, "m": message_id, "w": why},
            )
        )
        == 1
    )


def near_miss_list(session: Session, signal_id: str) -> Sequence[Row]:
    return (
        session.execute(
            text(
                """
                SELECT n.message_id, n.why, m.received_at, m.subject, m.run_marker
                  FROM near_misses n JOIN messages m ON m.id = n.message_id
                 WHERE n.signal_id = :id
                 ORDER BY m.received_at
                """
            ),
            {"id": signal_id},
        )
        .mappings()
        .all()
    )


# ---------------------------------------------------------------- sink


def sink_message_store(
    session: Session,
    *,
    mail_from: str | None,
    envelope_recipients: Sequence[str],
    all_recipients: Sequence[str],
    raw: bytes,
) -> tuple[int, datetime]:
    row = session.execute(
        text(
            """
            INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw)
            VALUES (:f, :env, :all, :size, :raw)
            RETURNING id, received_at
            """
        ),
        {
            "f": mail_from,
            "env": list(envelope_recipients),
            "all": sorted(set(all_recipients)),
            "size": len(raw),
            "raw": raw,
        },
    ).one()
    return int(row[0]), row[1]


def sink_message_search(
    session: Session, *, since: datetime, recipients: Sequence[str] | None, limit: int = 500
) -> Sequence[Row]:
    params: dict[str, Any] = {"since": since, "limit": limit}
    where = ""
    if recipients:
        where = " AND all_recipients && CAST(:rcpts AS text[])"
        params["rcpts"] = sorted(recipients)
    return (
        session.execute(
            text(
                "SELECT id, received_at, envelope_recipients, raw FROM sink_messages"
                " WHERE received_at >= :since" + where + " ORDER BY received_at, id LIMIT :limit"
            ),
            params,
        )
        .mappings()
        .all()
    )


# ---------------------------------------------------------------- mailboxes


def mailbox_insert(session: Session, values: Mapping[Any, Any]) -> Row:
    return (
        session.execute(
            text(
                """
                INSERT INTO mailboxes (id, namespace, run_id, provider, address, expires_at)
                VALUES (:id, :namespace, :run_id, :provider, :address,
                        now() + make_interval(secs => :ttl))
                RETURNING *
                """
            ),
            dict(values),
        )
        .mappings()
        .one()
    )


def mailbox_owner_get(session: Session, address: str) -> str | None:
    """The namespace of the mailbox at `address` (live or deleted), or None."""
    return session.execute(
        text("SELECT namespace FROM mailboxes WHERE address = :a"), {"a": address.strip().lower()}
    ).scalar_one_or_none()


def mailbox_delete(session: Session, mailbox_id: str, namespace: str) -> Row | None:
    return (
        session.execute(
            text(
                "UPDATE mailboxes SET deleted_at = now() WHERE id = :id AND namespace = :ns"
                " AND deleted_at IS NULL RETURNING *"
            ),
            {"id": mailbox_id, "ns": namespace},
        )
        .mappings()
        .first()
    )


def mailbox_purge_messages(session: Session, address: str) -> int:
    """Delete the sink's copies and the observed bodies for `address`; the
    message summaries, receipts and evidence stay."""
    addr = [address.lower()]
    deleted = affected(
        session.execute(
            text("DELETE FROM sink_messages WHERE all_recipients && CAST(:a AS text[])"),
            {"a": addr},
        )
    )
    session.execute(
        text("UPDATE messages SET raw = NULL WHERE recipients && CAST(:a AS text[])"), {"a": addr}
    )
    return deleted
