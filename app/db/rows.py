"""What the table modules share: the row type they return, and the few ways
they run a statement and read its answer.

The helpers run `session.execute(text(sql), params)`: the statement runs in
the caller's session and transaction, as a hand-written call would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, RowMapping, TextClause, text

# What a repository function returns for a row: a RowMapping, or a dict from raw.
Row = Mapping[Any, Any]


def affected(result: Any) -> int:
    """Rows an UPDATE/INSERT/DELETE touched (0 when its guard did not hold)."""
    return int(getattr(result, "rowcount", 0) or 0)


def _statement(sql: str | TextClause) -> TextClause:
    return text(sql) if isinstance(sql, str) else sql


def touched_one(session: Connection, sql: str | TextClause, params: Mapping[str, Any]) -> bool:
    """Run a guarded write; True when it touched exactly one row (False: its
    guard did not hold, someone moved first)."""
    return affected(session.execute(_statement(sql), dict(params))) == 1


def first(
    session: Connection, sql: str | TextClause, params: Mapping[str, Any]
) -> RowMapping | None:
    """The statement's first row, or None."""
    return session.execute(_statement(sql), dict(params)).mappings().first()


def every(
    session: Connection, sql: str | TextClause, params: Mapping[str, Any]
) -> Sequence[RowMapping]:
    """Every row of the statement."""
    return session.execute(_statement(sql), dict(params)).mappings().all()


def by_column(
    session: Connection, sql: str | TextClause, params: Mapping[str, Any], column: str = "signal_id"
) -> dict[Any, RowMapping]:
    """The statement's rows keyed by `column` (the last row wins a repeat)."""
    return {r[column]: r for r in every(session, sql, params)}
