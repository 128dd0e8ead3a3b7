"""Repository of mailboxes (`mailboxes`): addresses a namespace owns.

A deleted mailbox still owns its address (no other namespace may use it);
deleting one purges the mail stored for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.records import CountRow, MailboxRow
from app.db.runner import Statement

_MAILBOX_OWNERS: Statement = Statement(
    "mailbox_owner_many", "SELECT address, namespace FROM mailboxes WHERE address = ANY(:a)"
)


_INSERT: Statement[MailboxRow] = Statement(
    "mailbox_insert",
    """
                INSERT INTO mailboxes (id, namespace, run_id, provider, address, expires_at)
                VALUES (:id, :namespace, :run_id, :provider, :address,
                        now() + make_interval(secs => :ttl))
                RETURNING *
                """,
)
_LOCK_NAMESPACE: Statement = Statement(
    "mailbox_lock_namespace",
    "SELECT pg_advisory_xact_lock(hashtextextended('mailboxes:' || :ns, 0))",
)
_LIVE_COUNT: Statement[CountRow] = Statement(
    "mailbox_live_count",
    "SELECT count(*) FROM mailboxes WHERE namespace = :ns"
    " AND deleted_at IS NULL AND expires_at > now()",
)
_EXPIRE_DUE: Statement[MailboxRow] = Statement(
    "mailbox_expire_due",
    """
            UPDATE mailboxes SET deleted_at = now() WHERE id IN (
                SELECT id FROM mailboxes
                 WHERE deleted_at IS NULL AND expires_at <= now()
                 ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED)
            RETURNING address, namespace
            """,
)
_DELETE: Statement[MailboxRow] = Statement(
    "mailbox_delete",
    "UPDATE mailboxes SET deleted_at = now() WHERE id = :id AND namespace = :ns"
    " AND deleted_at IS NULL RETURNING *",
)


def mailbox_insert(session: Connection, values: Mapping[Any, Any]) -> MailboxRow:
    row = runner.one(session, _INSERT, values)
    assert row is not None  # INSERT … RETURNING: one row
    return row


def mailbox_live_count(session: Connection, namespace: str) -> int:
    """How many of `namespace`'s mailboxes are live (neither deleted nor
    expired), counted under a per-namespace lock held until the transaction
    ends, so that concurrent creates count one after the other."""
    runner.exec(session, _LOCK_NAMESPACE, {"ns": namespace})
    row = runner.one(session, _LIVE_COUNT, {"ns": namespace})
    assert row is not None
    return int(row["count"])


def mailbox_expire_due(session: Connection, limit: int) -> list[tuple[str, str]]:
    """Delete (as DELETE /v1/mailboxes does) up to `limit` mailboxes whose
    `expires_at` has passed; their (address, namespace)."""
    rows = runner.all(session, _EXPIRE_DUE, {"limit": limit})
    return [(r["address"], r["namespace"]) for r in rows]


def mailbox_owner_many(session: Connection, addresses: Sequence[str]) -> dict[str, str]:
    """address → the namespace whose mailbox it is (deleted ones still own it)."""
    if not addresses:
        return {}
    rows = runner.all(session, _MAILBOX_OWNERS, {"a": sorted({a.lower() for a in addresses})})
    return {r["address"]: r["namespace"] for r in rows}


def mailbox_delete(session: Connection, mailbox_id: str, namespace: str) -> MailboxRow | None:
    return runner.one(session, _DELETE, {"id": mailbox_id, "ns": namespace})


# Whether `{addr}` (a lower-cased address, in an SQL scope that also names
# `{received}`, when the message came) is another namespace's concern, or a
# waiting signal's of any namespace: another namespace owns it (mailbox,
# owned domain), held it when the message came or since, or watches it; or a
# waiting signal could still match mail to it. Mail with one such recipient
# is not the deleting namespace's alone, and stays.
_FOREIGN_OR_WAITING = """(
        EXISTS (SELECT 1 FROM mailboxes mb WHERE mb.address = {addr} AND mb.namespace <> :ns)
     OR split_part({addr}, '@', 2) = ANY(CAST(:foreign_domains AS text[]))
     OR EXISTS (SELECT 1 FROM address_holds ah
                 WHERE ah.address = {addr} AND ah.namespace <> :ns
                   AND (ah.released_at IS NULL OR ah.released_at > {received}))
     OR EXISTS (SELECT 1 FROM signals s WHERE s.recipient = {addr} AND s.namespace <> :ns)
     OR EXISTS (SELECT 1 FROM signals s WHERE s.recipient = {addr} AND s.status = 'waiting'))"""

# The statuses whose message is never purged, whatever their namespace.
_IN_PLAY = "('waiting', 'found', 'claimed')"

_PURGE_SINK: Statement = Statement(
    "mailbox_purge_sink",
    f"""
    DELETE FROM sink_messages sm
     WHERE sm.all_recipients && CAST(:a AS text[])
       AND NOT EXISTS (
            SELECT 1 FROM unnest(sm.all_recipients) AS r(a)
             WHERE {_FOREIGN_OR_WAITING.format(addr="r.a", received="sm.received_at")})
       AND NOT EXISTS (
            SELECT 1 FROM messages m JOIN signals s ON s.message_id = m.id
             WHERE m.provider_message_id = sm.id::text AND s.status IN {_IN_PLAY})
""",
)

_PURGE_OBSERVED: Statement = Statement(
    "mailbox_purge_observed",
    f"""
    UPDATE messages m SET raw = NULL
     WHERE m.recipients && CAST(:a AS text[]) AND m.raw IS NOT NULL
       AND NOT EXISTS (
            SELECT 1 FROM unnest(m.recipients || coalesce(m.delivered_to, '{{}}')) AS r(a)
             WHERE {_FOREIGN_OR_WAITING.format(addr="r.a", received="m.received_at")})
       AND NOT EXISTS (
            SELECT 1 FROM signals s WHERE s.message_id = m.id AND s.status IN {_IN_PLAY})
""",
)


def mailbox_purge_messages(
    session: Connection, address: str, namespace: str, foreign_domains: Sequence[str] = ()
) -> int:
    """Delete the sink's copies and the observed bodies of the mail to
    `address` that belongs to `namespace` alone: none of its recipients is
    owned, held or watched by another namespace (`foreign_domains`: the
    domains other namespaces own), none is a waiting signal's recipient, and
    no waiting, found or claimed signal points at it. The message
    summaries, receipts and evidence stay; what is kept ages out with
    retention."""
    params = {
        "a": [address.lower()],
        "ns": namespace,
        "foreign_domains": sorted({d.lower() for d in foreign_domains}),
    }
    deleted = runner.exec(session, _PURGE_SINK, params)
    runner.exec(session, _PURGE_OBSERVED, params)
    return deleted
