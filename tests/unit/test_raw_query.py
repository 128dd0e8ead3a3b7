"""raw.Query: the repository's `:name` parameters in psycopg's style."""

from __future__ import annotations

from app.db.raw import Query


def test_named_parameters_become_pyformat_and_casts_and_literals_stay() -> None:
    query = Query(
        "SELECT :id::text, CAST(:ids AS text[]), '00:10:00'::interval, x % 64,"
        " a||:b, f(:c_2) WHERE y LIKE 'a%'"
    )
    assert query.psycopg_sql == (
        "SELECT %(id)s::text, CAST(%(ids)s AS text[]), '00:10:00'::interval, x %% 64,"
        " a||%(b)s, f(%(c_2)s) WHERE y LIKE 'a%%'"
    )
    assert query.sql.startswith("SELECT :id::text")
