"""Planner statistics of the hot tables, refreshed while they grow from empty.

A statement the application runs often is prepared on its connection and,
after a few runs, planned once for any parameters (a generic plan) from the
statistics of that moment. On a fresh database those say the tables are
empty, and the plan made then scans them: the one-statement first look found
its signal by reading every waiting one (54 ms per call at 50,000 waiting
against 0.04 ms by the primary key, `EXPLAIN ANALYZE`), and kept doing so on
that connection until the next `ANALYZE` of `signals` invalidated it.
Autovacuum analyzes a table once a tenth of it changed, but looks only every
`autovacuum_naptime` (a minute by default): a database filled in its first
minute, as a CI run or a burst of creates fills it, was planned as empty for
all of that minute.

`analyze_grown` analyzes each hot table that changed by at least its own size
since its statistics were taken (and by at least `floor` rows), which the sweep
asks every tick: a handful of `ANALYZE`s while a table grows from empty (each
doubling, roughly), none once it is steady, where autovacuum's tenth comes
first. `SKIP_LOCKED`: a table autovacuum is analyzing is left to it.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.db import runner
from app.db.runner import Statement

# The tables the hot statements read by something other than their key.
HOT_TABLES = ("signals", "sink_messages", "messages", "checks", "claims")

_ANALYZE: dict[str, Statement] = {
    table: Statement(f"analyze_{table}", f"ANALYZE (SKIP_LOCKED) {table}") for table in HOT_TABLES
}

# reltuples is -1 for a table never analyzed. The counter is the server's
# cumulative statistics (a backend reports its changes within a second or
# so), read by its function: the `pg_stat_user_tables` view costs 0.2 ms of
# execution and 0.5 of planning, every sweep tick.
_GROWN: Statement = Statement(
    "tables_grown_since_analyze",
    """
    SELECT c.relname AS name
      FROM pg_class c
     WHERE c.oid = ANY(CAST(:tables AS regclass[]))
       AND pg_stat_get_mod_since_analyze(c.oid) >= greatest(:floor, c.reltuples)
     ORDER BY c.relname
    """,
)


def analyze_grown(session: Connection, *, floor: int = 1000) -> list[str]:
    """Analyze the hot tables that changed by at least their own size (and
    `floor` rows) since their last statistics; the names analyzed. Run it on
    an autocommit connection: each `ANALYZE` commits on its own."""
    grown = runner.all(session, _GROWN, {"tables": list(HOT_TABLES), "floor": floor})
    for row in grown:
        runner.exec(session, _ANALYZE[row["name"]])
    return [row["name"] for row in grown]
