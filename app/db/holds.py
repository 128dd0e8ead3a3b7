"""Repository of address holds (`address_holds`): who held an address nobody
owns, and when (app.domain.ownership says what a hold means).

The open hold of an address (released_at NULL) is unique: two namespaces
taking a fresh address at once serialise on that index, and one of them wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.runner import Statement
from app.domain.ownership import Hold
from app.domain.states import Status

# A signal that still needs its address: waiting or claimed, or found and
# claimable before its deadline (a found signal nobody claims ends there).
_LIVE = f"""(status IN ('{Status.WAITING.value}', '{Status.CLAIMED.value}')
             OR (status = '{Status.FOUND.value}' AND expires_at > now()))"""
_ENDED_AT = f"""CASE WHEN status = '{Status.FOUND.value}' THEN expires_at
                    ELSE coalesce(expired_at, updated_at) END"""


_LOCK: Statement = Statement(
    "hold_lock", "SELECT pg_advisory_xact_lock(hashtextextended('hold:' || :a, 0))"
)


def hold_lock(session: Connection, address: str) -> None:
    """Serialise, until the transaction ends, the creates deciding who holds `address`."""
    runner.exec(session, _LOCK, {"a": address})


_OPEN_GET = (
    "SELECT id, namespace, held_from FROM address_holds WHERE address = :a AND released_at IS NULL"
)
_OPEN: Statement = Statement("hold_open_get", _OPEN_GET)
_OPEN_FOR_UPDATE: Statement = Statement("hold_open_get_for_update", _OPEN_GET + " FOR UPDATE")


def hold_open_get(
    session: Connection, address: str, *, for_update: bool = False
) -> dict[str, Any] | None:
    """The address's open hold (id, namespace, held_from), if any; locked
    `for_update` (a create of its holder, which locks it FOR SHARE, then waits)."""
    return runner.one(session, _OPEN_FOR_UPDATE if for_update else _OPEN, {"a": address})


_KEEP: Statement = Statement(
    "hold_keep",
    "SELECT 1 AS kept FROM address_holds WHERE address = :a AND namespace = :ns"
    " AND released_at IS NULL FOR SHARE",
)


def hold_keep(session: Connection, address: str, namespace: str) -> bool:
    """Lock `namespace`'s open hold of `address` FOR SHARE until the
    transaction ends (no other namespace takes the address meanwhile); False
    when the open hold is not (or no longer) `namespace`'s."""
    return runner.one(session, _KEEP, {"a": address, "ns": namespace}) is not None


_SIGNALS_FACTS: Statement = Statement(
    "hold_signals_facts",
    f"""
        SELECT coalesce(bool_or({_LIVE}), false) AS live,
               max(CASE WHEN {_LIVE} THEN NULL ELSE {_ENDED_AT} END) AS last_end
          FROM signals WHERE recipient = :a AND namespace = :ns
        """,
)


def hold_signals_facts(session: Connection, address: str, namespace: str) -> dict[str, Any]:
    """Whether `namespace` has a live signal on `address`, and when its last
    one ended (`live`, `last_end`): what the hold's lapse is judged on."""
    row = runner.one(session, _SIGNALS_FACTS, {"a": address, "ns": namespace})
    assert row is not None  # an aggregate always answers one row
    return row


_RELEASE: Statement = Statement(
    "hold_release",
    "UPDATE address_holds SET released_at = :t WHERE id = :id AND released_at IS NULL",
)


def hold_release(session: Connection, hold_id: int, released_at: datetime) -> None:
    runner.exec(session, _RELEASE, {"id": hold_id, "t": released_at})


_INSERT: Statement = Statement(
    "hold_insert",
    "INSERT INTO address_holds (address, namespace, held_from) VALUES (:a, :ns, :t)",
)


def hold_insert(session: Connection, address: str, namespace: str, held_from: datetime) -> None:
    runner.exec(session, _INSERT, {"a": address, "ns": namespace, "t": held_from})


# The mailbox owners (kind 'm') and the hold episodes (kind 'h') of a set of
# addresses, in one round trip.
_STANDING: Statement = Statement(
    "hold_standing_many",
    """
    SELECT 'm' AS kind, address, namespace, NULL::timestamptz AS held_from,
           NULL::timestamptz AS released_at, 0::bigint AS id
      FROM mailboxes WHERE address = ANY(:a)
    UNION ALL
    SELECT 'h', address, namespace, held_from, released_at, id
      FROM address_holds WHERE address = ANY(:a)
    ORDER BY kind, address, held_from, id
    """,
)


def standing_many(
    session: Connection, addresses: Sequence[str]
) -> tuple[dict[str, str], dict[str, list[Hold]]]:
    """(address → the namespace whose mailbox it is, address → its hold
    episodes oldest first) of `addresses`, in one statement."""
    if not addresses:
        return {}, {}
    mailboxes: dict[str, str] = {}
    holds: dict[str, list[Hold]] = {}
    for r in runner.all(session, _STANDING, {"a": sorted({a.lower() for a in addresses})}):
        if r["kind"] == "m":
            mailboxes[r["address"]] = r["namespace"]
        else:
            holds.setdefault(r["address"], []).append(
                Hold(
                    namespace=r["namespace"],
                    held_from=r["held_from"],
                    released_at=r["released_at"],
                )
            )
    return mailboxes, holds
