"""Repository of the SMTP sink's store (`sink_messages`): the `sink` provider's mailbox.

The SMTP handler stores each message raw with its envelope recipients; the
`sink` provider pages through a window's messages and reads the ones just
before it (near misses worth reporting).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Unpack

from sqlalchemy import Connection

from app.db import runner
from app.db.near import NearWindow, near_address_sql, near_params
from app.db.pagination import Keyset
from app.db.runner import Statement
from app.domain.ids import new_id


def sink_messages_store(
    session: Connection, items: Sequence[tuple[Any, ...]]
) -> list[tuple[int, str, datetime]]:
    """Store raw messages ``(mail_from, recipients, raw[, auth_namespace])`` in
    one statement, each with ``recipients`` (lower-cased, sorted) as its
    envelope and all recipients, a fresh ``msg_`` id, and the namespace its
    sender authenticated for (or None); their (sink id, message id,
    received_at), in the order of ``items``.

    Rows are inserted in the items' order (``ORDER BY n``), so the sequence
    hands out ascending ids in that order: the returned ids, sorted, map back
    to the items by position (RETURNING itself has no guaranteed order)."""
    if not items:
        return []
    rows = ", ".join(
        f"(CAST(:f{i} AS text), CAST(:r{i} AS text[]), CAST(:b{i} AS bytea), {i},"
        f" CAST(:m{i} AS text), CAST(:a{i} AS text))"
        for i in range(len(items))
    )
    params: dict[str, Any] = {}
    for i, item in enumerate(items):
        mail_from, recipients, data = item[:3]
        params[f"f{i}"] = mail_from
        params[f"a{i}"] = item[3] if len(item) > 3 else None
        params[f"r{i}"] = sorted({r.lower() for r in recipients})
        params[f"b{i}"] = data
        params[f"m{i}"] = new_id("msg")
    stored = runner.all(
        session,
        runner.variant(
            "sink_messages_store",
            "INSERT INTO sink_messages"
            " (mail_from, envelope_recipients, all_recipients, size, raw, message_id,"
            " auth_namespace) "
            "SELECT f, r, r, octet_length(b), b, m, a "
            f"FROM (VALUES {rows}) AS v(f, r, b, n, m, a) ORDER BY n "
            "RETURNING id, message_id, received_at",
        ),
        params,
    )
    return sorted((int(r["id"]), r["message_id"], r["received_at"]) for r in stored)


def sink_message_add_recipients(
    session: Connection, sink_id: int, recipients: Sequence[str]
) -> int:
    """Add ``recipients`` (lower-cased) to ``all_recipients`` of one sink message,
    sorted and without repeats (once its headers are parsed, off the SMTP path);
    returns 1 when the row exists, else 0."""
    params = {"id": sink_id, "rcpts": sorted({r.lower() for r in recipients})}
    return runner.exec(session, _ADD_RECIPIENTS, params)


_ADD_RECIPIENTS: Statement = Statement(
    "sink_message_add_recipients",
    """
                UPDATE sink_messages
                   SET all_recipients = ARRAY(
                         SELECT DISTINCT r
                           FROM unnest(all_recipients || CAST(:rcpts AS text[])) AS r
                          ORDER BY r)
                 WHERE id = :id
                """,
)


_BY_RECEIPT = Keyset("sm.received_at, sm.id")


def sink_message_page(
    session: Connection,
    *,
    windows: Sequence[tuple[str, datetime]],
    after: tuple[datetime, int] | None,
    limit: int,
    recorded_by: str,
) -> list[dict[str, Any]]:
    """One page (oldest first, after `after`) of the sink messages to any of
    the `windows`' recipients received at or after that recipient's moment,
    each with `recorded_id` (see :func:`_with_recorded_id`)."""
    params = _window_params(windows)
    params["recorded_by"] = recorded_by
    return runner.all(
        session,
        runner.variant(
            "sink_message_page",
            _with_recorded_id(_page_sql(after, limit, params)) + " ORDER BY q.received_at, q.id",
        ),
        params,
        binary=True,  # the raw bytes as they are, not as hex twice their size
    )


def _with_recorded_id(sql: str) -> str:
    """The rows of `sql` (sink messages), each with `recorded_id`: our id in
    `messages` for it as provider `:recorded_by`'s message, NULL when no
    check has recorded it. A check records what it sees with these, without
    asking again which of them are recorded (one statement fewer per look)."""
    return (
        "SELECT q.*, (SELECT m.id FROM messages m WHERE m.provider = :recorded_by"
        " AND m.provider_message_id = CAST(q.id AS text)) AS recorded_id FROM (" + sql + ") q"
    )


def _window_arrays(windows: Sequence[tuple[str, datetime]]) -> dict[str, Any]:
    """The windows as the two arrays the statements unnest side by side:
    `:rcpts` (the recipients) and `:sinces` (each one's moment)."""
    return {"rcpts": [r for r, _ in windows], "sinces": [t for _, t in windows]}


def _window_params(windows: Sequence[tuple[str, datetime]]) -> dict[str, Any]:
    return {**_window_arrays(windows), "since": min(t for _, t in windows)}


def _page_sql(after: tuple[datetime, int] | None, limit: int, params: dict[str, Any]) -> str:
    return (
        """
            SELECT sm.id, sm.received_at, sm.envelope_recipients, sm.size, sm.message_id,
                   sm.auth_namespace
              FROM sink_messages sm
             WHERE sm.all_recipients && CAST(:rcpts AS text[])
               AND sm.received_at >= :since
               AND EXISTS (
                    SELECT 1 FROM unnest(CAST(:rcpts AS text[]),
                                         CAST(:sinces AS timestamptz[])) AS w(r, s)
                     WHERE w.r = ANY(sm.all_recipients) AND sm.received_at >= w.s)"""
        + " AND "
        + _BY_RECEIPT.after(after, params)
        + _BY_RECEIPT.page(limit, params)
    )


def sink_message_raws(session: Connection, ids: Sequence[int]) -> dict[int, bytes]:
    """The raw bytes of the sink messages `ids` (those still stored). A look
    reads a window's rows without them (`size` instead) and asks for a few
    messages' bytes at a time, only those it must parse."""
    if not ids:
        return {}
    rows = runner.all(
        session,
        _RAWS,
        {"ids": [int(i) for i in ids]},
        binary=True,  # the bytes as they are, not as hex twice their size
    )
    return {int(r["id"]): bytes(r["raw"]) for r in rows}


_RAWS: Statement = Statement(
    "sink_message_raws", "SELECT id, raw FROM sink_messages WHERE id = ANY(:ids)"
)


def sink_message_first_page(
    session: Connection,
    *,
    windows: Sequence[tuple[str, datetime]],
    limit: int,
    lookback_seconds: float,
    per_recipient: int,
    recorded_by: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first page of :func:`sink_message_page` and the rows of
    :func:`sink_message_before_windows`, in one round trip: (page, before),
    each row with `recorded_id` (see :func:`_with_recorded_id`)."""
    params = _window_params(windows)
    params.update(lookback=lookback_seconds, per=per_recipient, recorded_by=recorded_by)
    sql = _with_recorded_id(
        "SELECT false AS before_window, p.* FROM ("
        + _page_sql(None, limit, params)
        + ") p UNION ALL SELECT true, b.* FROM ("
        + _BEFORE_WINDOWS.sql
        + ") b"
    )
    rows = runner.all(session, runner.variant("sink_message_first_page", sql), params, binary=True)
    # The union keeps no order: the page is sorted again (its last row is the cursor).
    page = sorted(
        (r for r in rows if not r["before_window"]), key=lambda r: (r["received_at"], r["id"])
    )
    return page, [r for r in rows if r["before_window"]]


_BEFORE_WINDOWS: Statement = Statement(
    "sink_message_before_windows",
    """
                SELECT DISTINCT ON (m.id) m.id, m.received_at, m.envelope_recipients, m.size,
                       m.message_id, m.auth_namespace
                  FROM unnest(CAST(:rcpts AS text[]), CAST(:sinces AS timestamptz[])) AS w(r, s)
                 CROSS JOIN LATERAL (
                        SELECT sm.id, sm.received_at, sm.envelope_recipients, sm.size,
                               sm.message_id, sm.auth_namespace
                          FROM (SELECT id, received_at, envelope_recipients, size, message_id,
                                       auth_namespace
                                  FROM sink_messages
                                 WHERE all_recipients && ARRAY[w.r]
                                OFFSET 0) sm
                         WHERE sm.received_at >= w.s - make_interval(secs => :lookback)
                           AND sm.received_at < w.s
                         ORDER BY sm.received_at DESC
                         LIMIT :per) m
""",
)


def sink_message_before_windows(
    session: Connection,
    *,
    windows: Sequence[tuple[str, datetime]],
    lookback_seconds: float,
    per_recipient: int,
) -> list[dict[str, Any]]:
    """The latest `per_recipient` sink messages to each recipient received
    within `lookback_seconds` before its window: near misses worth reporting.

    The recipient's messages come from the GIN index alone (the `OFFSET 0`
    keeps the time bounds out of that scan): the planner cannot know a
    window's moment, guesses the lookback holds few messages, and otherwise
    walks the time index backwards through every message of the lookback,
    22 ms per window at 60,000 messages against 0.03 ms by recipient."""
    return runner.all(
        session,
        _BEFORE_WINDOWS,
        {**_window_arrays(windows), "lookback": lookback_seconds, "per": per_recipient},
        binary=True,
    )


# A recipient typo (app.db.near). Only the latest `scan` messages of the
# window are looked at, so a busy window costs a bounded read.
_NEAR_ADDRESSES: Statement = Statement(
    "sink_message_near_addresses",
    f"""
    SELECT w.id, w.received_at, w.all_recipients, sm.envelope_recipients, sm.size,
           sm.message_id, sm.auth_namespace
      FROM (SELECT id, received_at, all_recipients
              FROM sink_messages
             WHERE received_at >= :since AND received_at <= :until
             ORDER BY received_at DESC LIMIT :scan) w
      JOIN sink_messages sm ON sm.id = w.id
     WHERE {near_address_sql("w.all_recipients")}
     ORDER BY w.received_at, w.id
     LIMIT :limit
    """,
)


def sink_message_near_address(
    session: Connection, recipient: str, **window: Unpack[NearWindow]
) -> list[dict[str, Any]]:
    """Up to `limit` sink messages received between `since` and `until` (among
    the latest `scan` of them) that are not to `recipient` but to an address
    of its length ± 2 sharing its local part or its domain: the candidates of
    a recipient typo."""
    return runner.all(session, _NEAR_ADDRESSES, {**window, **near_params(recipient)})
