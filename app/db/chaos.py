"""Repository of the sink's chaos rules (`chaos_rules`): each namespace's
list, replaced whole; the live rules the sink holds; and the one guarded
update that counts a rule applied, shared by every sink process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, text

from app.db import raw
from app.db.rows import Row, every, first

_COLUMNS = (
    "id, namespace, position, recipient, stage, reply, times, probability, applied,"
    " created_at, expires_at"
)


def chaos_rule_replace(
    session: Connection, namespace: str, rules: Sequence[Mapping[str, Any]]
) -> Sequence[Row]:
    """Replace `namespace`'s rules by `rules` (in their order), each ending
    its `expires_in` seconds from now; returns them."""
    session.execute(text("DELETE FROM chaos_rules WHERE namespace = :ns"), {"ns": namespace})
    for position, rule in enumerate(rules):
        session.execute(
            text(
                "INSERT INTO chaos_rules (id, namespace, position, recipient, stage, reply,"
                " times, probability, expires_at)"
                " VALUES (:id, :ns, :position, :recipient, :stage, :reply, :times,"
                " :probability, now() + make_interval(secs => :expires_in))"
            ),
            {**rule, "ns": namespace, "position": position},
        )
    return chaos_rule_list(session, namespace)


def chaos_rule_list(session: Connection, namespace: str) -> Sequence[Row]:
    """`namespace`'s rules that have not ended, in their order."""
    return every(
        session,
        f"SELECT {_COLUMNS} FROM chaos_rules"
        " WHERE namespace = :ns AND expires_at > now() ORDER BY position",
        {"ns": namespace},
    )


def chaos_rule_delete(session: Connection, namespace: str) -> int:
    """Remove every rule of `namespace` (and any ended rule of anyone's)."""
    result = session.execute(
        text("DELETE FROM chaos_rules WHERE namespace = :ns OR expires_at <= now()"),
        {"ns": namespace},
    )
    return int(getattr(result, "rowcount", 0) or 0)


_LIVE = raw.Query(
    f"SELECT {_COLUMNS}, (times IS NOT NULL AND applied >= times) AS exhausted"
    " FROM chaos_rules WHERE expires_at > now() ORDER BY created_at, namespace, position"
)


def chaos_rule_live(session: Connection) -> list[Mapping[Any, Any]]:
    """Every rule that has not ended, in every namespace: what the sink holds."""
    return raw.rows(session, _LIVE, {})


def chaos_rule_apply(session: Connection, rule_id: str) -> str | None:
    """Count rule `rule_id` applied once, unless it ended or used up its
    `times` (the guard is the update itself: concurrent sinks never apply a
    rule more often than it allows); returns its reply, or None."""
    row = first(
        session,
        "UPDATE chaos_rules SET applied = applied + 1"
        " WHERE id = :id AND expires_at > now() AND (times IS NULL OR applied < times)"
        " RETURNING reply",
        {"id": rule_id},
    )
    return None if row is None else str(row["reply"])
