"""Repository of observed messages (`messages`) and near misses (`near_misses`).

A message seen at a provider is recorded once (unique on provider and the
provider's id); a near miss is a message addressed to a signal's recipient
that did not match it, with why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from sqlalchemy import Connection

from app.db import runner
from app.db.near import NearWindow, near_address_sql, near_params
from app.db.records import MessageRow
from app.db.runner import Statement
from app.domain.ids import new_id


def _with_defaults(row: Mapping[Any, Any]) -> dict[Any, Any]:
    return {
        "delivered_to": None,
        "bare_lf": False,
        "from_addr": None,
        "to_addrs": None,
        "cc_addrs": None,
        "header_message_id": None,
        "attachments": 0,
        "words": "",
        "auth_namespace": None,
        "sink_id": None,
        **row,
    }


def message_record_new(
    session: Connection,
    provider: str,
    rows: Sequence[Mapping[Any, Any]],
    known: Mapping[str, str | None] | None = None,
    recorded: set[str] | None = None,
) -> dict[str, str]:
    """Record the observed messages not recorded yet, once each, and return
    provider id → our id for all of `rows`; `recorded` (when given) gets the
    provider ids this call's inserts recorded. (Comparing ids cannot tell: a
    sink message keeps the id it was stored with, whoever records it.)

    Raw bytes already stored are never sent again: the known ids are read
    first, except those in `known` (provider id → our id, or None: not
    recorded when the provider was asked; one recorded since is found by
    its insert, which then records nothing). New rows are inserted in
    provider-id order, the one order every check inserts in, so two checks
    recording overlapping mail never deadlock on the unique index.
    """
    if not rows:
        return {}
    known = known or {}
    ids = {pid: our_id for pid, our_id in known.items() if our_id is not None}
    unknown = [r["provider_message_id"] for r in rows if r["provider_message_id"] not in known]
    if unknown:
        ids.update(message_ids_by_provider_id(session, provider, unknown))
    new = sorted(
        (r for r in rows if r["provider_message_id"] not in ids),
        key=lambda r: str(r["provider_message_id"]),
    )
    missing: list[str] = []
    for chunk in _chunks(new):
        inserted = dict(
            (r["provider_message_id"], r["id"])
            for r in runner.all(session, _insert_returning(len(chunk)), _numbered(chunk))
        )
        ids.update(inserted)
        if recorded is not None:
            recorded.update(inserted)
        # Not returned: another check recorded it first (its transaction
        # committed while this insert waited); its id is read below.
        missing += [
            r["provider_message_id"] for r in chunk if r["provider_message_id"] not in inserted
        ]
    if missing:
        ids.update(message_ids_by_provider_id(session, provider, missing))
    # Still missing: its given id (a sink message's, from its store) is
    # another provider's row already (two sink-type providers read one
    # sink): recorded again under an id of its own.
    again = [dict(r, id=new_id("msg")) for r in new if r["provider_message_id"] not in ids]
    if again:
        for r in runner.all(session, _insert_returning(len(again)), _numbered(again)):
            ids[r["provider_message_id"]] = r["id"]
            if recorded is not None:
                recorded.add(r["provider_message_id"])
        rest = [r["provider_message_id"] for r in again if r["provider_message_id"] not in ids]
        if rest:
            ids.update(message_ids_by_provider_id(session, provider, rest))
    return ids


# Messages per INSERT: each row is 19 parameters (psycopg takes at most
# 65,535 in one statement), and a look at a busy address sees thousands.
INSERT_CHUNK = 200
# Raw bytes sent per INSERT, at most (a message larger than that goes alone):
# psycopg copies each parameter into the statement's buffer.
INSERT_CHUNK_BYTES = 16 * 1024 * 1024


def _chunks(rows: Sequence[Mapping[Any, Any]]) -> list[list[Mapping[Any, Any]]]:
    chunks: list[list[Mapping[Any, Any]]] = []
    size = 0
    for row in rows:
        length = len(row.get("raw") or b"")
        if not chunks or len(chunks[-1]) >= INSERT_CHUNK or size + length > INSERT_CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(row)
        size += length
    return chunks


_COLUMNS = (
    "id",
    "provider",
    "provider_message_id",
    "received_at",
    "subject",
    "recipients",
    "delivered_to",
    "run_marker",
    "size",
    "bare_lf",
    "auth_namespace",
    "raw",
    "from_addr",
    "to_addrs",
    "cc_addrs",
    "header_message_id",
    "attachments",
    "words",
)
# How a column's parameter becomes its value: the words are made a
# `tsvector` by the database (the `simple` dictionary: no stemming, no stop
# words; what the inbox's free-word search looks up in its GIN index).
# A sink message's bytes are copied where they are stored (`sink_id`, its raw
# None): a look never sends 25 MiB back to the database.
_VALUE = {
    "words": "to_tsvector('simple', CAST(:words{i} AS text))",
    "raw": "coalesce(CAST(:raw{i} AS bytea),"
    " (SELECT s.raw FROM sink_messages s WHERE s.id = CAST(:sink_id{i} AS bigint)))",
}


def _insert_returning(count: int) -> Statement:
    """An INSERT of `count` messages in the order given, each recorded only
    if new; returns (provider_message_id, id) of those it recorded."""
    values = ", ".join(
        "("
        + ", ".join(_VALUE.get(column, f":{column}{{i}}").format(i=i) for column in _COLUMNS)
        + ")"
        for i in range(count)
    )
    # Any unique conflict: the same message recorded meanwhile, or its given
    # id taken (see message_record_new).
    return runner.variant(
        "message_record_many",
        f"INSERT INTO messages ({', '.join(_COLUMNS)}) VALUES {values}"
        " ON CONFLICT DO NOTHING"
        " RETURNING provider_message_id, id",
    )


def _numbered(rows: Sequence[Mapping[Any, Any]]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for i, row in enumerate(rows):
        full = _with_defaults(row)
        params.update((f"{column}{i}", full[column]) for column in (*_COLUMNS, "sink_id"))
    return params


_IDS_BY_PROVIDER_ID: Statement = Statement(
    "message_ids_by_provider_id",
    "SELECT provider_message_id, id FROM messages"
    " WHERE provider = :p AND provider_message_id = ANY(:ids)",
)
# An `arrived` signal (it expected no email) shows its message without taking it.
_TAKEN: Statement = Statement(
    "message_taken",
    "SELECT message_id, id FROM signals WHERE namespace = :ns AND message_id = ANY(:ids)"
    " AND status <> 'arrived'",
)
# The misses travel as one JSON array of arrays ([signal id, message id, why,
# the other reasons comma-joined (a Why holds no comma), typo address or
# null]), not as five PostgreSQL arrays: psycopg dumps a list into
# a PostgreSQL array element by element, in Python (1.15 ms for the four
# arrays of 100 misses, against 0.09 ms for json.dumps), and a push look at
# a shared address records a miss for every message of the window, for
# every signal of it, all signals in one statement.
_NEAR_MISSES: Statement = Statement(
    "message_near_misses",
    """
    INSERT INTO near_misses (signal_id, message_id, why, also, address)
    SELECT e->>0, e->>1, e->>2, coalesce(string_to_array(nullif(e->>3, ''), ','), '{}'), e->>4
      FROM jsonb_array_elements(CAST(:misses AS jsonb)) AS e
     -- A check fenced out (its signal redriven meanwhile) writes no near miss.
     WHERE e->>5 IS NULL
        OR EXISTS (SELECT 1 FROM signals s
                    WHERE s.id = e->>0 AND s.check_fence = CAST(e->>5 AS bigint))
    ON CONFLICT DO NOTHING
    RETURNING signal_id, why
    """,
)


def message_ids_by_provider_id(
    session: Connection, provider: str, provider_ids: Sequence[str]
) -> dict[str, str]:
    rows = runner.all(session, _IDS_BY_PROVIDER_ID, {"p": provider, "ids": list(provider_ids)})
    return {r["provider_message_id"]: r["id"] for r in rows}


# Looks that would take the same recorded messages go one after the other:
# the second asks who took them once the first has committed. (A message a
# look records itself is serialised by its INSERT; one the sink recorded for
# the inbox at its 250 is not, and two pushed looks read it untaken at once.)
_LOCK: Statement = Statement(
    "message_lock", "SELECT id FROM messages WHERE id = ANY(:ids) ORDER BY id FOR NO KEY UPDATE"
)


def message_lock_many(session: Connection, message_ids: Sequence[str]) -> None:
    """Lock `message_ids`' rows (in id order) until the transaction ends."""
    runner.all(session, _LOCK, {"ids": sorted(message_ids)})


def message_taken(
    session: Connection, message_ids: Sequence[str], namespace: str
) -> dict[str, str]:
    """message id → the signal of `namespace` that already has it (another
    namespace's signal never hides a message from this one)."""
    rows = runner.all(session, _TAKEN, {"ids": list(message_ids), "ns": namespace})
    return {r["message_id"]: r["id"] for r in rows}


# What a recorded message is, without its bytes.
_SUMMARY = "id, provider, provider_message_id, received_at, subject, recipients, run_marker, size"
_GET_MANY: Statement[MessageRow] = Statement(
    "message_get_many", f"SELECT {_SUMMARY}, bare_lf FROM messages WHERE id = ANY(:ids)"
)
_DELIVERIES: Statement[MessageRow] = Statement(
    "message_deliveries",
    "SELECT id, received_at, coalesce(delivered_to, recipients) AS delivered_to,"
    " auth_namespace FROM messages WHERE id = ANY(:ids)",
)
_WITH_RAW: Statement[MessageRow] = Statement(
    "message_with_raw", f"SELECT {_SUMMARY}, raw FROM messages WHERE id = :id"
)


def message_get_many(session: Connection, message_ids: Sequence[str]) -> dict[str, MessageRow]:
    rows = runner.all(session, _GET_MANY, {"ids": list(message_ids)})
    return {r["id"]: r for r in rows}


def message_deliveries(
    session: Connection, message_ids: Sequence[str]
) -> list[tuple[str, Any, list[str], str | None]]:
    """(id, received_at, the recipients it was delivered to, the namespace
    its SMTP sender authenticated for) of each known message: `delivered_to`
    (or `recipients` for rows recorded before it), and `auth_namespace`."""
    if not message_ids:
        return []
    rows = runner.all(session, _DELIVERIES, {"ids": list(message_ids)})
    return [
        (r["id"], r["received_at"], list(r["delivered_to"] or ()), r["auth_namespace"])
        for r in rows
    ]


def message_with_raw(session: Connection, message_id: str) -> MessageRow | None:
    """One message's summary and its raw bytes (None once purged), in one statement."""
    return runner.one(session, _WITH_RAW, {"id": message_id})


_RAW: Statement[MessageRow] = Statement(
    "message_raw", "SELECT id, received_at, subject, size, raw FROM messages WHERE id = :id"
)


def message_raw(session: Connection, message_id: str) -> MessageRow | None:
    """One message's summary and raw bytes (None once purged), read in binary
    format: the bytes cross once, not as hex twice their size."""
    return runner.one(session, _RAW, {"id": message_id}, binary=True)


def near_miss_record_many(
    session: Connection,
    signal_id: str,
    misses: Sequence[tuple[str, str, Sequence[str]]],
    addresses: Sequence[str | None] | None = None,
    fence: int | None = None,
) -> list[str]:
    """Record near misses of a signal, each (message id, why, also), in one
    statement (a message already recorded for the signal stays as it was);
    `addresses`, when given, are the addresses of recipient typos, one per
    miss. Returns the `why` of each one that was new."""
    typos = addresses or [None] * len(misses)
    return [
        why
        for _, why in near_misses_record(
            session,
            [
                (signal_id, mid, why, also, address)
                for (mid, why, also), address in zip(misses, typos, strict=True)
            ],
            None if fence is None else {signal_id: fence},
        )
    ]


def near_misses_record(
    session: Connection,
    misses: Sequence[tuple[str, str, str, Sequence[str], str | None]],
    fences: Mapping[str, int] | None = None,
) -> list[tuple[str, str]]:
    """Record near misses of any signals, each (signal id, message id, why,
    also, typo address or None), in one statement; a message already
    recorded for its signal stays as it was, and so does a repeat within
    `misses` (the first one given is kept). `fences` (signal id → the
    check's fence): a signal whose fence moved on (a redrive fenced the
    check out) gets none. Returns (signal id, why) of each one that was new."""
    if not misses:
        return []
    fences = fences or {}
    given: set[tuple[str, str]] = set()
    kept: list[tuple[str, str, str, str, str | None, int | None]] = []
    for signal_id, mid, why, also, address in misses:
        if (signal_id, mid) not in given:
            given.add((signal_id, mid))
            kept.append(
                (signal_id, mid, why, ",".join(also), address or None, fences.get(signal_id))
            )
    rows = runner.all(session, _NEAR_MISSES, {"misses": json.dumps(kept)})
    return [(r["signal_id"], r["why"]) for r in rows]


def near_miss_typo_of_namespace(session: Connection, namespace: str, message_id: str) -> bool:
    """Whether the message is a `recipient_typo` near miss of one of `namespace`'s signals."""
    params = {"m": message_id, "ns": namespace}
    return runner.one(session, _TYPO_OF_NAMESPACE, params) is not None


_TYPO_OF_NAMESPACE: Statement = Statement(
    "near_miss_typo_of_namespace",
    "SELECT 1 FROM near_misses n JOIN signals s ON s.id = n.signal_id"
    " WHERE n.message_id = :m AND n.why = 'recipient_typo' AND s.namespace = :ns"
    " LIMIT 1",
)


def near_miss_list(session: Connection, signal_id: str) -> list[dict[str, Any]]:
    return runner.all(session, _NEAR_MISS_LIST, {"id": signal_id})


_NEAR_MISS_LIST: Statement = Statement(
    "near_miss_list",
    """
                SELECT n.message_id, n.why, n.also, n.address, m.received_at, m.subject,
                       m.run_marker
                  FROM near_misses n JOIN messages m ON m.id = n.message_id
                 WHERE n.signal_id = :id
                 ORDER BY m.received_at
        """,
)


_NEAR_ADDRESSES: Statement = Statement(
    "message_near_addresses",
    f"""
    SELECT w.id, w.provider_message_id, w.received_at, w.recipients, w.size
      FROM (SELECT id, provider_message_id, received_at, recipients, size
              FROM messages
             WHERE provider = :provider AND received_at >= :since AND received_at <= :until
               AND raw IS NOT NULL
             ORDER BY received_at DESC LIMIT :scan) w
     WHERE {near_address_sql("w.recipients")}
     ORDER BY w.received_at, w.id
     LIMIT :limit
    """,
)


def message_raws(
    session: Connection, provider_ids: Sequence[str], *, provider: str
) -> dict[str, bytes]:
    """The raw bytes of `provider`'s recorded messages `provider_ids` (those
    not purged), by provider message id."""
    if not provider_ids:
        return {}
    rows = runner.all(
        session,
        _RAWS,
        {"p": provider, "ids": list(provider_ids)},
        binary=True,  # the bytes as they are, not as hex twice their size
    )
    return {str(r["provider_message_id"]): bytes(r["raw"]) for r in rows}


_RAWS: Statement = Statement(
    "message_raws",
    "SELECT provider_message_id, raw FROM messages"
    " WHERE provider = :p AND provider_message_id = ANY(:ids) AND raw IS NOT NULL",
)


def message_near_address(
    session: Connection, provider: str, recipient: str, **window: Unpack[NearWindow]
) -> list[dict[str, Any]]:
    """Up to `limit` recorded messages of `provider` received between `since`
    and `until` (among the latest `scan`) not to `recipient` but to an address
    of its length ± 2 sharing its local part or its domain (with their size,
    not their bytes: `message_raws`; purged ones are left out): the
    candidates of a recipient typo."""
    return runner.all(
        session, _NEAR_ADDRESSES, {"provider": provider, **window, **near_params(recipient)}
    )


# The messages a check recorded for one recipient in one window, oldest first:
# their summaries only (a body filter reads each one's bytes on its own).
_IN_WINDOW: Statement = Statement(
    "message_in_window",
    """
    SELECT id, received_at, subject, recipients, run_marker, raw IS NULL AS purged
      FROM messages
     WHERE provider = :provider AND recipients @> ARRAY[CAST(:recipient AS text)]
       AND received_at >= :opens AND received_at <= :closes
     ORDER BY received_at, id
     LIMIT :limit
    """,
)


def message_list_in_window(
    session: Connection,
    provider: str,
    recipient: str,
    *,
    opens: Any,
    closes: Any,
    limit: int,
) -> list[dict[str, Any]]:
    """Up to `limit` recorded messages of `provider` addressed to `recipient`
    (envelope, To or Cc) received in [opens, closes], oldest first: their
    summaries and whether their content was purged, never their bytes."""
    return runner.all(
        session,
        _IN_WINDOW,
        {
            "provider": provider,
            "recipient": recipient.lower(),
            "opens": opens,
            "closes": closes,
            "limit": limit,
        },
    )
