"""Hot statements run on the connection's DBAPI (psycopg) connection directly.

SQLAlchemy's ``execute(text(...))`` costs about 170 µs of CPU per
statement on this stack's kind of machine, where psycopg alone takes 40 µs
for the same statement (bench/PROFILE.md, §9): the compile-cache lookup,
the execution context and the result wrapper, for statements whose SQL is
fixed and whose rows are read as mappings. A :class:`Query` keeps the
repository's ``:name`` parameter style and runs inside the caller's connection
and transaction (its connection, its BEGIN and COMMIT), so it mixes freely
with ``connection.execute``. Errors come out as SQLAlchemy's (``OperationalError``
and friends), and a lost connection invalidates the pool, exactly as they
would from ``connection.execute``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Connection

__all__ = ["Query", "query", "row", "rows", "rows_together", "run"]

# `:name`, not a `::type` cast, not inside a word (`'00:10:00'` has digits).
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class Query:
    """One fixed SQL text with ``:name`` parameters, converted once to psycopg's
    ``%(name)s`` style (a literal ``%`` doubled)."""

    __slots__ = ("psycopg_sql", "sql")

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.psycopg_sql = _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))


@functools.lru_cache(maxsize=256)
def query(sql: str) -> Query:
    """The :class:`Query` of an SQL text built at run time from a few fixed
    variants (optional filters, a batch's row count): converted once each."""
    return Query(sql)


def _execute(
    connection: Connection, query: Query, params: Mapping[str, Any], binary: bool = False
) -> psycopg.Cursor[Any]:
    # In a transaction, psycopg sends BEGIN before the first statement.
    driver = connection.connection.driver_connection
    assert driver is not None
    cursor = driver.cursor(row_factory=dict_row)
    try:
        cursor.execute(query.psycopg_sql, params, binary=binary)  # type: ignore[call-overload]
    except psycopg.Error as error:
        try:
            # SQLAlchemy's own handling: wrap the error, and on a lost
            # connection invalidate it (and the pool). Always raises.
            connection._handle_dbapi_exception(error, query.sql, dict(params), cursor, None)
        finally:
            cursor.close()
    return cursor


def rows(
    connection: Connection, query: Query, params: Mapping[str, Any], *, binary: bool = False
) -> list[Mapping[Any, Any]]:
    """Every row, as dicts (``binary``: see :func:`row`)."""
    with _execute(connection, query, params, binary) as cursor:
        return list(cursor.fetchall())


def row(
    connection: Connection, query: Query, params: Mapping[str, Any], *, binary: bool = False
) -> dict[str, Any] | None:
    """The first row as a dict, or None. ``binary``: results in PostgreSQL's
    binary format (a ``bytea`` arrives as its bytes, not as twice as much hex)."""
    with _execute(connection, query, params, binary) as cursor:
        return cursor.fetchone()


def rows_together(
    connection: Connection, statements: Sequence[tuple[Query, Mapping[str, Any]]]
) -> list[list[Mapping[Any, Any]]]:
    """Every row of each statement, the statements sent at once (psycopg's
    pipeline mode): one round trip for all. On an autocommit connection they
    are one implicit transaction, committed once at the end: a later
    statement sees what an earlier one wrote, and an error in any of them
    undoes them all (and is raised as SQLAlchemy's, as from :func:`rows`)."""
    driver = connection.connection.driver_connection
    assert driver is not None
    cursors: list[psycopg.Cursor[Any]] = []
    try:
        with driver.pipeline():
            for query, params in statements:
                cursor = driver.cursor(row_factory=dict_row)
                cursors.append(cursor)
                cursor.execute(query.psycopg_sql, params)  # type: ignore[call-overload]
        return [list(cursor.fetchall()) for cursor in cursors]
    except psycopg.Error as error:
        # SQLAlchemy's own handling, as in `_execute` (the error does not
        # say which statement failed: all are named). Always raises.
        sql = ";\n".join(query.sql for query, _ in statements)
        params = {k: v for _, p in statements for k, v in p.items()}
        connection._handle_dbapi_exception(error, sql, params, None, None)
        raise  # not reached
    finally:
        for cursor in cursors:
            cursor.close()


def run(connection: Connection, query: Query, params: Mapping[str, Any]) -> int:
    """Run a statement that returns no rows; how many rows it touched."""
    with _execute(connection, query, params) as cursor:
        return cursor.rowcount
