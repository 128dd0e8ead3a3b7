"""The recipient-typo heuristic, defined once for every table that records
mail (`messages`, `sink_messages`): a near address is one of the recipient's
length ± 2 that keeps its local part or its domain whole (a typo differs in
one of them, never both)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict


def near_address_sql(addresses: str) -> str:
    """The SQL condition: `addresses` (a text[] expression) does not hold
    `:rcpt` but holds an address near it. Its parameters: `near_params`."""
    return f"""NOT (:rcpt = ANY({addresses}))
       AND EXISTS (
            SELECT 1 FROM unnest({addresses}) AS r(a)
             WHERE abs(length(r.a) - length(:rcpt)) <= 2
               AND (right(r.a, length(:at_domain)) = :at_domain
                    OR left(r.a, length(:local_at)) = :local_at))"""


class NearWindow(TypedDict):
    """Where a near-address statement looks: the messages received between
    `since` and `until`, the latest `scan` of them, and at most `limit`
    candidates back."""

    since: datetime
    until: datetime
    scan: int
    limit: int


def near_params(recipient: str) -> dict[str, Any]:
    """The parameters of `near_address_sql` for `recipient`."""
    local, _, domain = recipient.lower().rpartition("@")
    return {"rcpt": recipient.lower(), "at_domain": "@" + domain, "local_at": local + "@"}
