"""Keyset pagination: the one way a list query pages.

A page is the rows after a cursor in a fixed order of two columns, the
second unique (`(created_at, id)`): `WHERE (a, b) > (:after_ts, :after_id)
ORDER BY a, b LIMIT :limit`. No OFFSET, so a page costs the same deep in a
list as at its start, and rows inserted meanwhile never shift a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Keyset:
    """The order a list pages in: two columns, as written in the query
    (`"created_at, id"`, or with a table's alias)."""

    columns: str = "created_at, id"
    # Newest first: the rows before the cursor, in descending order.
    descending: bool = False

    def after(self, after: tuple[Any, Any] | None, params: dict[str, Any]) -> str:
        """The condition that a row comes after the cursor `after`, its values
        put into `params`; `"true"` for the first page (`after` None)."""
        if after is None:
            return "true"
        params.update(after_ts=after[0], after_id=after[1])
        return f"({self.columns}) {'<' if self.descending else '>'} (:after_ts, :after_id)"

    def page(self, limit: int, params: dict[str, Any]) -> str:
        """`ORDER BY … LIMIT :limit` of one page of `limit` rows."""
        params["limit"] = limit
        order = self.columns
        if self.descending:
            order = ", ".join(f"{c.strip()} DESC" for c in self.columns.split(","))
        return f" ORDER BY {order} LIMIT :limit"


BY_CREATION = Keyset()
