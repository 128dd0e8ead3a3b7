"""Repository of the sink's chaos rules (`chaos_rules`): each namespace's
list, replaced whole; the live rules the sink holds; and the one guarded
update that counts a rule applied, shared by every sink process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from app.db import runner
from app.db.records import ChaosRuleRow
from app.db.runner import Statement

_COLUMNS = (
    "id, namespace, position, recipient, stage, reply, times, probability, applied,"
    " created_at, expires_at"
)

_CLEAR: Statement = Statement(
    "chaos_rule_clear_namespace", "DELETE FROM chaos_rules WHERE namespace = :ns"
)
_INSERT: Statement = Statement(
    "chaos_rule_insert",
    "INSERT INTO chaos_rules (id, namespace, position, recipient, stage, reply,"
    " times, probability, expires_at)"
    " VALUES (:id, :ns, :position, :recipient, :stage, :reply, :times,"
    " :probability, now() + make_interval(secs => :expires_in))",
)
_LIST: Statement[ChaosRuleRow] = Statement(
    "chaos_rule_list",
    f"SELECT {_COLUMNS} FROM chaos_rules"
    " WHERE namespace = :ns AND expires_at > now() ORDER BY position",
)
_DELETE: Statement = Statement(
    "chaos_rule_delete", "DELETE FROM chaos_rules WHERE namespace = :ns OR expires_at <= now()"
)
_APPLY: Statement[ChaosRuleRow] = Statement(
    "chaos_rule_apply",
    "UPDATE chaos_rules SET applied = applied + 1"
    " WHERE id = :id AND expires_at > now() AND (times IS NULL OR applied < times)"
    " RETURNING reply",
)


def chaos_rule_replace(
    session: Connection, namespace: str, rules: Sequence[Mapping[str, Any]]
) -> list[ChaosRuleRow]:
    """Replace `namespace`'s rules by `rules` (in their order), each ending
    its `expires_in` seconds from now; returns them."""
    runner.exec(session, _CLEAR, {"ns": namespace})
    for position, rule in enumerate(rules):
        runner.exec(session, _INSERT, {**rule, "ns": namespace, "position": position})
    return chaos_rule_list(session, namespace)


def chaos_rule_list(session: Connection, namespace: str) -> list[ChaosRuleRow]:
    """`namespace`'s rules that have not ended, in their order."""
    return runner.all(session, _LIST, {"ns": namespace})


def chaos_rule_delete(session: Connection, namespace: str) -> int:
    """Remove every rule of `namespace` (and any ended rule of anyone's)."""
    return runner.exec(session, _DELETE, {"ns": namespace})


_LIVE: Statement[ChaosRuleRow] = Statement(
    "chaos_rule_live",
    f"SELECT {_COLUMNS}, (times IS NOT NULL AND applied >= times) AS exhausted"
    " FROM chaos_rules WHERE expires_at > now() ORDER BY created_at, namespace, position",
)


def chaos_rule_live(session: Connection) -> list[ChaosRuleRow]:
    """Every rule that has not ended, in every namespace: what the sink holds."""
    return runner.all(session, _LIVE)


def chaos_rule_apply(session: Connection, rule_id: str) -> str | None:
    """Count rule `rule_id` applied once, unless it ended or used up its
    `times` (the guard is the update itself: concurrent sinks never apply a
    rule more often than it allows); returns its reply, or None."""
    row = runner.one(session, _APPLY, {"id": rule_id})
    return None if row is None else str(row["reply"])
