"""Queries of the metrics gauges that the other repository modules do not have."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session


def dead_letter_count_by_reason_state_namespace(
    session: Session,
) -> dict[tuple[str, str, str], int]:
    rows = session.execute(
        text(
            "SELECT reason, state, namespace, count(*) FROM dead_letters"
            " GROUP BY reason, state, namespace"
        )
    ).all()
    return {(r[0], r[1], r[2]): int(r[3]) for r in rows}
