"""Use cases of the inbox: list and search the messages a namespace may see,
read one, mark them read, purge them; operators list every namespace's with
subjects masked and read none.

Who may see a message is decided by `app.usecases.visibility` (§11.1) for
every row a page shows: a page is read newest first in chunks and the rows
the caller may not see are skipped, so a page may hold fewer than `limit`
items and still have a `next_cursor` (at most SCAN_ROWS rows are read per
request). In a deployment with one namespace, mail that nobody owned or held
is that namespace's too: nobody else could ever see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import inbox as inbox_db
from app.db import tokens as tokens_db
from app.db.engine import transaction
from app.db.inbox import InboxFilter
from app.domain.inbox_query import InboxQuery, QueryError, parse_query
from app.domain.masking import mask_subject
from app.domain.ownership import sees
from app.errors import InvalidInput, NotFound
from app.settings import Settings, get_settings
from app.usecases import views
from app.usecases.auth import Principal
from app.usecases.visibility import belonging

# Rows read per chunk while filling a page, and at most per request.
CHUNK_ROWS = 200
SCAN_ROWS = 5000


class BadQuery(InvalidInput):
    code = "invalid_query"
    default_message = "The search does not parse."


def query_of(text: str | None, field: str = "q") -> InboxQuery:
    """The parsed search, or 422 `invalid_query` naming the bad term."""
    if not text:
        return InboxQuery()
    try:
        return parse_query(text)
    except QueryError as exc:
        error = BadQuery(str(exc), field=field)
        error.details["term"] = exc.term
        raise error from None


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None
    # The rows behind the items (for the Mailpit shapes).
    rows: list[Any]


def sole_namespace(session: Connection, settings: Settings) -> str | None:
    """The deployment's one namespace, when it has exactly one."""
    names = set(settings.token_map.values()) | set(tokens_db.token_namespaces_some(session, 2))
    return next(iter(names)) if len(names) == 1 else None


def _belonging_rows(
    session: Connection, settings: Settings, rows: Sequence[Any]
) -> dict[str, frozenset[str]]:
    """message id → the namespaces it belongs to, for inbox rows."""
    return belonging(
        session,
        settings,
        [(r["id"], r["received_at"], r["delivered_to"], r["auth_namespace"]) for r in rows],
    )


def visible_rows(
    session: Connection, settings: Settings, namespace: str | None, rows: Sequence[Any]
) -> list[Any]:
    """The rows `namespace` may see (an operator, `namespace` None: all)."""
    if namespace is None or not rows:
        return list(rows)
    belongs = _belonging_rows(session, settings, rows)
    alone = sole_namespace(session, settings) == namespace
    return [
        r for r in rows if sees(namespace, belongs[r["id"]]) or (alone and not belongs[r["id"]])
    ]


def item_view(row: Any, taken_by: str | None, *, masked: bool = False) -> dict[str, Any]:
    """One list item (docs/api.md, `GET /v1/messages`)."""
    subject = row["subject"] or ""
    return {
        "message_id": row["id"],
        "received_at": views.iso(row["received_at"]),
        "provider": row["provider"],
        "from": row["from_addr"],
        "to": list(row["to_addrs"] or ()),
        "cc": list(row["cc_addrs"] or ()),
        "subject": mask_subject(subject) if masked else subject,
        "size": row["size"],
        "attachments": row["attachments"],
        "run_marker": row["run_marker"],
        "taken_by": taken_by,
        "purged": bool(row["purged"]),
    }


def _page(
    session: Connection,
    settings: Settings,
    namespace: str | None,
    filters: InboxFilter,
    *,
    limit: int,
    after: tuple[datetime, str] | None,
) -> tuple[list[Any], tuple[datetime, str] | None]:
    """Up to `limit` visible rows after `after`, and the cursor of the next
    page (None: no more)."""
    kept: list[Any] = []
    scanned = 0
    while True:
        chunk = inbox_db.inbox_page(session, filters, after=after, limit=CHUNK_ROWS)
        scanned += len(chunk)
        for row in visible_rows(session, settings, namespace, chunk):
            kept.append(row)
            if len(kept) == limit:
                last = (row["received_at"], row["id"])
                more = row is not chunk[-1] or len(chunk) == CHUNK_ROWS
                return kept, last if more else None
        if len(chunk) < CHUNK_ROWS:
            return kept, None
        after = (chunk[-1]["received_at"], chunk[-1]["id"])
        if scanned >= SCAN_ROWS:
            return kept, after


def list_messages(
    caller: Principal,
    filters: InboxFilter,
    *,
    limit: int,
    cursor: str | None,
) -> Page:
    """`GET /v1/messages`: the caller's messages, newest first."""
    after = views.decode_cursor(cursor) if cursor else None
    settings = get_settings()
    namespace = caller.namespace
    with transaction() as session:
        rows, next_after = _page(session, settings, namespace, filters, limit=limit, after=after)
        takers = (
            inbox_db.inbox_takers(session, namespace, [r["id"] for r in rows]) if namespace else {}
        )
    items = [item_view(r, takers.get(r["id"]), masked=caller.is_ops) for r in rows]
    next_cursor = views.encode_cursor(*next_after) if next_after else None
    return Page(items, next_cursor, rows)


def count_messages(namespace: str, filters: InboxFilter, *, cap: int = 100_000) -> int:
    """How many messages `namespace` may see among those `filters` match (up to `cap`)."""
    settings = get_settings()
    with transaction() as session:
        if sole_namespace(session, settings) == namespace:
            return inbox_db.inbox_count(session, filters, cap=cap)
    total, after = 0, None
    with transaction() as session:
        while total < cap:
            chunk = inbox_db.inbox_page(session, filters, after=after, limit=CHUNK_ROWS)
            total += len(visible_rows(session, settings, namespace, chunk))
            if len(chunk) < CHUNK_ROWS:
                break
            after = (chunk[-1]["received_at"], chunk[-1]["id"])
    return total


def visible_items(namespace: str, message_ids: Sequence[str]) -> list[Any]:
    """The rows of these messages that `namespace` may see, in the order given."""
    with transaction() as session:
        rows = inbox_db.inbox_items(session, message_ids)
        seen = {r["id"]: r for r in visible_rows(session, get_settings(), namespace, rows)}
    return [seen[m] for m in message_ids if m in seen]


def message_row(namespace: str, message_id: str) -> Any:
    """One visible message's row; NotFound otherwise."""
    rows = visible_items(namespace, [message_id])
    if not rows:
        raise NotFound(f"no message {message_id}")
    return rows[0]


def mark_read(namespace: str, message_ids: Sequence[str], *, read: bool) -> int:
    """Set or clear the read flag of the visible ones among `message_ids`."""
    ids = [r["id"] for r in visible_items(namespace, message_ids)]
    with transaction() as session:
        return inbox_db.inbox_mark_read(session, ids, read=read) if ids else 0


def _own(session: Connection, settings: Settings, namespace: str, rows: Sequence[Any]) -> list[str]:
    """The ids among `rows` that belong to `namespace` alone (or nobody, in
    a one-namespace deployment): what its delete may purge."""
    belongs = _belonging_rows(session, settings, rows)
    alone = sole_namespace(session, settings) == namespace
    return [
        r["id"]
        for r in rows
        if belongs[r["id"]] == frozenset({namespace}) or (alone and not belongs[r["id"]])
    ]


def delete_messages(namespace: str, message_ids: Sequence[str]) -> int:
    """Purge the content of those of `message_ids` that are the namespace's
    own; how many were purged."""
    settings = get_settings()
    with transaction() as session:
        rows = inbox_db.inbox_items(session, message_ids)
        own = _own(session, settings, namespace, rows)
        return inbox_db.inbox_purge(session, own) if own else 0


def delete_matching(namespace: str, filters: InboxFilter) -> int:
    """Purge the content of every message of the namespace's own that `filters` match."""
    settings = get_settings()
    total, after = 0, None
    while True:
        with transaction() as session:
            chunk = inbox_db.inbox_page(session, filters, after=after, limit=CHUNK_ROWS)
            own = _own(session, settings, namespace, chunk)
            total += inbox_db.inbox_purge(session, own) if own else 0
        if len(chunk) < CHUNK_ROWS:
            return total
        after = (chunk[-1]["received_at"], chunk[-1]["id"])


def event_items(
    message_ids: Sequence[str], namespaces: set[str]
) -> dict[str, list[dict[str, Any]]]:
    """For each of `namespaces`, the list items of those of `message_ids` it
    may see, oldest first: the inbox's live events (one read for all)."""
    settings = get_settings()
    with transaction() as session:
        rows = sorted(
            inbox_db.inbox_items(session, message_ids), key=lambda r: (r["received_at"], r["id"])
        )
        if not rows:
            return {}
        belongs = _belonging_rows(session, settings, rows)
        alone = sole_namespace(session, settings)
    return {
        ns: [
            item_view(r, None)
            for r in rows
            if sees(ns, belongs[r["id"]]) or (alone == ns and not belongs[r["id"]])
        ]
        for ns in namespaces
    }


def offset_rows(namespace: str, filters: InboxFilter, *, start: int, limit: int) -> list[Any]:
    """Rows `start` to `start + limit` of the namespace's messages matching
    `filters`, newest first (Mailpit's offset pages, read by keyset)."""
    settings = get_settings()
    wanted = start + limit
    kept: list[Any] = []
    after: tuple[datetime, str] | None = None
    with transaction() as session:
        while len(kept) < wanted:
            chunk = inbox_db.inbox_page(session, filters, after=after, limit=CHUNK_ROWS)
            kept += visible_rows(session, settings, namespace, chunk)
            if len(chunk) < CHUNK_ROWS:
                break
            after = (chunk[-1]["received_at"], chunk[-1]["id"])
    return kept[start:wanted]


def mark_matching(namespace: str, filters: InboxFilter, *, read: bool) -> int:
    """Set or clear the read flag of every message of the namespace `filters` match."""
    settings = get_settings()
    total, after = 0, None
    while True:
        with transaction() as session:
            chunk = inbox_db.inbox_page(session, filters, after=after, limit=CHUNK_ROWS)
            ids = [r["id"] for r in visible_rows(session, settings, namespace, chunk)]
            total += inbox_db.inbox_mark_read(session, ids, read=read) if ids else 0
        if len(chunk) < CHUNK_ROWS:
            return total
        after = (chunk[-1]["received_at"], chunk[-1]["id"])
