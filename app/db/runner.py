"""The one way the application runs SQL: named statements, one runner, typed rows.

Every statement is a module-level :class:`Statement` in its table's module:
a name (``claim_take``) and its SQL with ``:name`` parameters, converted once
to psycopg's ``%(name)s`` style. :func:`one`, :func:`all`, :func:`exec` and
:func:`together` run it on the psycopg connection under the caller's
SQLAlchemy ``Connection``, inside the caller's transaction (its BEGIN and
COMMIT), so SQLAlchemy stays the engine, the pool and the transaction owner.

Why psycopg directly: SQLAlchemy's ``execute(text(...))`` costs about 170 µs
of CPU per statement on this stack's kind of machine, where psycopg alone
takes 40 µs for the same statement (bench/PROFILE.md, §9): the compile-cache
lookup, the execution context and the result wrapper. Errors still come out
as SQLAlchemy's (``OperationalError`` and friends), and a lost connection
invalidates the pool, exactly as they would from ``connection.execute``.

A statement's rows are dicts typed by the statement (``Statement[ClaimRow]``,
a TypedDict, app/db/records.py): a cast, no conversion. SQL built at run time
from a few fixed variants (optional filters, a batch's row count) is made by
a named builder through :func:`variant`, converted once per variant.
"""

from __future__ import annotations

import builtins
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Generic, cast

import psycopg
from psycopg.rows import dict_row
from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import DBAPICursor
from typing_extensions import TypeVar

__all__ = ["Statement", "all", "exec", "one", "registered", "together", "variant"]

R = TypeVar("R", default=dict[str, Any])

# `:name`, not a `::type` cast, not inside a word (`'00:10:00'` has digits).
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
# Every named statement, by name (variants go under their builder's name).
_REGISTRY: dict[str, Statement[Any]] = {}


class Statement(Generic[R]):
    """One named SQL text with ``:name`` parameters, converted once to
    psycopg's ``%(name)s`` style (a literal ``%`` doubled). ``R`` is the
    kind of row it returns."""

    __slots__ = ("name", "psycopg_sql", "sql")

    def __init__(self, name: str, sql: str, *, _variant: bool = False) -> None:
        self.name = name
        self.sql = sql
        self.psycopg_sql = _NAMED.sub(r"%(\1)s", sql.replace("%", "%%"))
        if not _variant:
            if name in _REGISTRY:
                raise ValueError(f"a statement named {name!r} exists already")
            _REGISTRY[name] = self

    def __repr__(self) -> str:
        return f"Statement({self.name!r})"


def registered() -> dict[str, Statement[Any]]:
    """Every named statement made so far, by name."""
    return dict(_REGISTRY)


@functools.lru_cache(maxsize=256)
def _variant(name: str, sql: str) -> Statement[Any]:
    return Statement(name, sql, _variant=True)


def variant(name: str, sql: str) -> Statement[Any]:
    """The statement ``name`` in one of its run-time variants (``sql`` made
    by that statement's builder from a few fixed pieces): converted once each."""
    return _variant(name, sql)


def _execute(
    connection: Connection, stmt: Statement[Any], params: Mapping[str, Any], binary: bool
) -> psycopg.Cursor[dict[str, Any]]:
    # In a transaction, psycopg sends BEGIN before the first statement.
    driver = connection.connection.driver_connection
    assert driver is not None
    cursor: psycopg.Cursor[dict[str, Any]] = driver.cursor(row_factory=dict_row)
    try:
        cursor.execute(stmt.psycopg_sql, params, binary=binary)
    except psycopg.Error as error:
        try:
            # SQLAlchemy's own handling: wrap the error, and on a lost
            # connection invalidate it (and the pool). Always raises.
            # psycopg's cursor is a DBAPI cursor; SQLAlchemy's protocol does not say so.
            dbapi_cursor = cast("DBAPICursor", cursor)
            connection._handle_dbapi_exception(error, stmt.sql, dict(params), dbapi_cursor, None)
        finally:
            cursor.close()
    return cursor


_NO_PARAMS: Mapping[str, Any] = {}


def one(
    connection: Connection,
    stmt: Statement[R],
    params: Mapping[str, Any] = _NO_PARAMS,
    *,
    binary: bool = False,
) -> R | None:
    """The first row, or None. ``binary``: results in PostgreSQL's binary
    format (a ``bytea`` arrives as its bytes, not as twice as much hex)."""
    with _execute(connection, stmt, params, binary) as cursor:
        return cast("R | None", cursor.fetchone())


def all(  # the runner's verbs: one, all, exec
    connection: Connection,
    stmt: Statement[R],
    params: Mapping[str, Any] = _NO_PARAMS,
    *,
    binary: bool = False,
) -> list[R]:
    """Every row (``binary``: see :func:`one`)."""
    with _execute(connection, stmt, params, binary) as cursor:
        return cast("list[R]", cursor.fetchall())


def exec(  # the runner's verbs: one, all, exec
    connection: Connection, stmt: Statement[Any], params: Mapping[str, Any] = _NO_PARAMS
) -> int:
    """Run a statement for its effect; how many rows it touched (0 when a
    guarded write's guard did not hold: someone moved first)."""
    with _execute(connection, stmt, params, False) as cursor:
        return cursor.rowcount


def together(
    connection: Connection, statements: Sequence[tuple[Statement[Any], Mapping[str, Any]]]
) -> builtins.list[builtins.list[dict[str, Any]]]:
    """Every row of each statement, the statements sent at once (psycopg's
    pipeline mode): one round trip for all. On an autocommit connection they
    are one implicit transaction, committed once at the end: a later
    statement sees what an earlier one wrote, and an error in any of them
    undoes them all (and is raised as SQLAlchemy's, as from :func:`all`)."""
    driver = connection.connection.driver_connection
    assert driver is not None
    cursors: builtins.list[psycopg.Cursor[dict[str, Any]]] = []
    try:
        with driver.pipeline():
            for stmt, params in statements:
                cursor: psycopg.Cursor[dict[str, Any]] = driver.cursor(row_factory=dict_row)
                cursors.append(cursor)
                cursor.execute(stmt.psycopg_sql, params)
        return [cursor.fetchall() for cursor in cursors]
    except psycopg.Error as error:
        # SQLAlchemy's own handling, as in `_execute` (the error does not
        # say which statement failed: all are named). Always raises.
        sql = ";\n".join(stmt.sql for stmt, _ in statements)
        merged = {k: v for _, p in statements for k, v in p.items()}
        connection._handle_dbapi_exception(error, sql, merged, None, None)
        raise  # not reached
    finally:
        for cursor in cursors:
            cursor.close()
