"""The runner's statements: `:name` parameters in psycopg's style, and every
statement of the repository named once."""

from __future__ import annotations

import importlib
import pkgutil

import app.db
from app.db import runner
from app.db.runner import Statement


def test_named_parameters_become_pyformat_and_casts_and_literals_stay() -> None:
    stmt = runner.variant(
        "test_conversion",
        "SELECT :id::text, CAST(:ids AS text[]), '00:10:00'::interval, x % 64,"
        " a||:b, f(:c_2) WHERE y LIKE 'a%'",
    )
    assert stmt.psycopg_sql == (
        "SELECT %(id)s::text, CAST(%(ids)s AS text[]), '00:10:00'::interval, x %% 64,"
        " a||%(b)s, f(%(c_2)s) WHERE y LIKE 'a%%'"
    )
    assert stmt.sql.startswith("SELECT :id::text")
    assert stmt.name == "test_conversion"


def test_a_variant_is_converted_once_and_not_registered() -> None:
    first = runner.variant("test_variant", "SELECT :a")
    assert runner.variant("test_variant", "SELECT :a") is first
    assert "test_variant" not in runner.registered()


def _db_modules() -> list[str]:
    return [f"app.db.{m.name}" for m in pkgutil.iter_modules(app.db.__path__)]


def test_every_statement_in_app_db_is_named_once_and_registered() -> None:
    modules = {name: importlib.import_module(name) for name in _db_modules()}
    registered = runner.registered()
    found = 0
    for name, module in modules.items():
        for attr, value in vars(module).items():
            if isinstance(value, Statement):
                found += 1
                assert registered.get(value.name) is value, f"{name}.{attr}: {value.name}"
    assert found >= 50
    # Names are unique: a second statement of a name fails at import.
    assert len({id(s) for s in registered.values()}) == len(registered)


def test_a_second_statement_of_a_name_is_refused() -> None:
    name = next(iter(runner.registered()))
    try:
        Statement(name, "SELECT 1")
    except ValueError as error:
        assert name in str(error)
    else:
        raise AssertionError("a duplicate name was accepted")
