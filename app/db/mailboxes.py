"""Repository of mailboxes (`mailboxes`): addresses a namespace owns.

A deleted mailbox still owns its address (no other namespace may use it);
deleting one purges the mail stored for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, text

from app.db import raw
from app.db.rows import Row, affected, first

_MAILBOX_OWNERS = raw.Query("SELECT address, namespace FROM mailboxes WHERE address = ANY(:a)")


def mailbox_insert(session: Connection, values: Mapping[Any, Any]) -> Row:
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


def mailbox_live_count(session: Connection, namespace: str) -> int:
    """How many of `namespace`'s mailboxes are live (neither deleted nor
    expired), counted under a per-namespace lock held until the transaction
    ends, so that concurrent creates count one after the other."""
    session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('mailboxes:' || :ns, 0))"),
        {"ns": namespace},
    )
    return int(
        session.execute(
            text(
                "SELECT count(*) FROM mailboxes WHERE namespace = :ns"
                " AND deleted_at IS NULL AND expires_at > now()"
            ),
            {"ns": namespace},
        ).scalar_one()
    )


def mailbox_expire_due(session: Connection, limit: int) -> list[str]:
    """Delete (as DELETE /v1/mailboxes does) up to `limit` mailboxes whose
    `expires_at` has passed; their addresses."""
    rows = session.execute(
        text(
            """
            UPDATE mailboxes SET deleted_at = now() WHERE id IN (
                SELECT id FROM mailboxes
                 WHERE deleted_at IS NULL AND expires_at <= now()
                 ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING address
            """
        ),
        {"limit": limit},
    )
    return [r[0] for r in rows]


def mailbox_owner_many(session: Connection, addresses: Sequence[str]) -> dict[str, str]:
    """address → the namespace whose mailbox it is (deleted ones still own it)."""
    if not addresses:
        return {}
    rows = raw.rows(session, _MAILBOX_OWNERS, {"a": sorted({a.lower() for a in addresses})})
    return {r["address"]: r["namespace"] for r in rows}


def mailbox_delete(session: Connection, mailbox_id: str, namespace: str) -> Row | None:
    return first(
        session,
        "UPDATE mailboxes SET deleted_at = now() WHERE id = :id AND namespace = :ns"
        " AND deleted_at IS NULL RETURNING *",
        {"id": mailbox_id, "ns": namespace},
    )


def mailbox_purge_messages(session: Connection, address: str) -> int:
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
