"""Repository of the inbox: the messages a namespace lists, searches, reads
the read flag of, and deletes (`messages`, and the sink's copy in
`sink_messages`).

A page is newest first by (received_at, id) (`ix_messages_received_at_id`).
A search (`app.domain.inbox_query`) runs on columns and indexes, never on a
message's bytes: an address by the GIN index of `recipients` (then the To
or Cc column of that row), Message-ID and From by their B-tree indexes,
free words and phrases by the GIN index of `words` (a `tsvector` of the
subject and text, `simple` dictionary), the subject by the row's `subject`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.pagination import Keyset
from app.db.runner import Statement
from app.domain.inbox_query import InboxQuery, Kind, Term

NEWEST_FIRST = Keyset("m.received_at, m.id", descending=True)

_ITEM_COLUMNS = (
    "m.id, m.received_at, m.provider, m.from_addr, m.to_addrs, m.cc_addrs, m.recipients,"
    " m.subject, m.size, m.attachments, m.run_marker, m.read_at,"
    " m.header_message_id, (m.raw IS NULL) AS purged,"
    " coalesce(m.delivered_to, m.recipients) AS delivered_to, m.auth_namespace"
)


@dataclass(frozen=True)
class InboxFilter:
    """What a list asks for besides its page: all AND-ed."""

    recipient: str | None = None
    run_id: str | None = None
    namespace: str | None = None  # whose signals `run_id` also looks at
    since: datetime | None = None
    until: datetime | None = None
    query: InboxQuery = field(default_factory=InboxQuery)
    # False: messages whose content was purged are left out (Mailpit's view).
    include_purged: bool = True


def _like(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _address_sql(column: str, term: Term, name: str, params: dict[str, Any]) -> str:
    value = str(term.value)
    if "@" in value and not value.startswith("@") and not term.negated:
        # A whole address: found by the recipients' GIN index first.
        params[name] = value
        if column == "from_addr":
            return f"m.from_addr = :{name}"
        return f"(m.recipients @> ARRAY[CAST(:{name} AS text)] AND :{name} = ANY(m.{column}))"
    params[name] = _like(value)
    if column == "from_addr":
        return f"coalesce(m.from_addr, '') LIKE :{name}"
    return f"EXISTS (SELECT 1 FROM unnest(m.{column}) AS a(v) WHERE a.v LIKE :{name})"


def term_sql(term: Term, name: str, params: dict[str, Any]) -> str:
    """One term as an SQL condition on `messages m` (its value in `params[name]`)."""
    kind = term.kind
    if kind is Kind.TO:
        sql = _address_sql("to_addrs", term, name, params)
    elif kind is Kind.CC:
        sql = _address_sql("cc_addrs", term, name, params)
    elif kind is Kind.FROM:
        sql = _address_sql("from_addr", term, name, params)
    elif kind is Kind.SUBJECT:
        params[name] = _like(str(term.value))
        sql = f"m.subject ILIKE :{name}"
    elif kind is Kind.MESSAGE_ID:
        params[name] = term.value
        sql = f"m.header_message_id = :{name}"
    elif kind is Kind.AFTER:
        params[name] = term.value
        sql = f"m.received_at > :{name}"
    elif kind is Kind.BEFORE:
        params[name] = term.value
        sql = f"m.received_at < :{name}"
    elif kind is Kind.HAS_ATTACHMENT:
        sql = "m.attachments > 0"
    elif kind is Kind.READ:
        sql = "m.read_at IS NOT NULL"
    elif kind is Kind.UNREAD:
        sql = "m.read_at IS NULL"
    elif kind is Kind.WORD:
        params[name] = str(term.value)
        sql = f"m.words @@ plainto_tsquery('simple', :{name})"
    else:  # Kind.PHRASE
        params[name] = str(term.value)
        sql = f"m.words @@ phraseto_tsquery('simple', :{name})"
    return f"NOT coalesce({sql}, false)" if term.negated else sql


def _where(filters: InboxFilter, params: dict[str, Any]) -> list[str]:
    where: list[str] = []
    if filters.recipient is not None:
        params["rcpt"] = filters.recipient.strip().lower()
        where.append("m.recipients @> ARRAY[CAST(:rcpt AS text)]")
    if filters.run_id is not None:
        params.update(run=filters.run_id, run_ns=filters.namespace)
        where.append(
            "(m.run_marker = :run OR m.id IN (SELECT s.message_id FROM signals s"
            " WHERE s.run_id = :run AND s.namespace = :run_ns AND s.message_id IS NOT NULL))"
        )
    if filters.since is not None:
        params["since"] = filters.since
        where.append("m.received_at >= :since")
    if filters.until is not None:
        params["until"] = filters.until
        where.append("m.received_at <= :until")
    if not filters.include_purged:
        where.append("m.raw IS NOT NULL")
    where += [term_sql(t, f"q{i}", params) for i, t in enumerate(filters.query.terms)]
    return where


def inbox_page(
    session: Connection,
    filters: InboxFilter,
    *,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Up to `limit` messages matching `filters`, newest first, before the cursor `after`."""
    params: dict[str, Any] = {}
    where = [*_where(filters, params), NEWEST_FIRST.after(after, params)]
    sql = f"SELECT {_ITEM_COLUMNS} FROM messages m WHERE " + " AND ".join(where)
    stmt = runner.variant("inbox_page", sql + NEWEST_FIRST.page(limit, params))
    return runner.all(session, stmt, params)


def inbox_count(session: Connection, filters: InboxFilter, *, cap: int) -> int:
    """How many messages match `filters`, counted up to `cap`."""
    params: dict[str, Any] = {"cap": cap}
    where = " AND ".join(_where(filters, params)) or "true"
    found = runner.one(
        session,
        runner.variant(
            "inbox_count",
            f"SELECT count(*) AS n FROM (SELECT 1 FROM messages m WHERE {where} LIMIT :cap) c",
        ),
        params,
    )
    return int(found["n"]) if found else 0


_ITEMS: Statement = Statement(
    "inbox_items", f"SELECT {_ITEM_COLUMNS} FROM messages m WHERE m.id = ANY(:ids)"
)


def inbox_items(session: Connection, message_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The list rows of these messages (unknown ids left out)."""
    return runner.all(session, _ITEMS, {"ids": list(message_ids)})


_LATEST_TAKERS: Statement = Statement(
    "inbox_takers",
    "SELECT message_id, id FROM signals WHERE namespace = :ns AND message_id = ANY(:ids)"
    " AND status <> 'arrived'",
)


def inbox_takers(session: Connection, namespace: str, message_ids: Sequence[str]) -> dict[str, str]:
    """message id → the signal of `namespace` that took it."""
    rows = runner.all(session, _LATEST_TAKERS, {"ns": namespace, "ids": list(message_ids)})
    return {r["message_id"]: r["id"] for r in rows}


_MARK_READ: Statement = Statement(
    "inbox_mark_read",
    "UPDATE messages SET read_at = CASE WHEN :read THEN coalesce(read_at, now()) END"
    " WHERE id = ANY(:ids)",
)


def inbox_mark_read(session: Connection, message_ids: Sequence[str], *, read: bool) -> int:
    """Set (or clear) the read flag of these messages; how many there were."""
    return runner.exec(session, _MARK_READ, {"ids": list(message_ids), "read": read})


_PURGE: Statement = Statement(
    "inbox_purge",
    "UPDATE messages SET raw = NULL, words = NULL WHERE id = ANY(:ids) AND raw IS NOT NULL",
)
_PURGE_SINK: Statement = Statement(
    "inbox_purge_sink", "DELETE FROM sink_messages WHERE message_id = ANY(:ids)"
)


def inbox_purge(session: Connection, message_ids: Sequence[str]) -> int:
    """Purge these messages' content: the raw bytes and words of their
    record (the summary, receipts and evidence stay) and the sink's copy (a
    look finds them no more: they match nothing). How many records were purged."""
    params = {"ids": list(message_ids)}
    runner.exec(session, _PURGE_SINK, params)
    return runner.exec(session, _PURGE, params)
