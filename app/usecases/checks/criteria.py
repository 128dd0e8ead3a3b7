"""What a signal matches, as the pure matcher takes it: the one search for
a batch of signals, a signal's criteria, the candidates the observed
messages make. Late mail (`app.usecases.late`)
matches with the same builders."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from app.domain.mail import DEFAULT_TEXT_MAX_BYTES
from app.domain.matching import Candidate, Criteria, floor_to
from app.providers.base import SearchQuery
from app.usecases.checks.observed import Observed

# How far before the earliest window a check still searches: messages that
# arrived just before the window are near misses worth reporting.
NEAR_MISS_LOOKBACK = timedelta(minutes=10)


def _minus(moment: datetime, delta: timedelta) -> datetime:
    try:
        return moment - delta
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def search_query(
    rows: Sequence[Mapping[Any, Any]],
    precision: timedelta,
    *,
    opens: str = "received_after",
    lookback: timedelta = NEAR_MISS_LOOKBACK,
) -> SearchQuery:
    """One search for the signals in `rows`: each recipient from the earliest
    window of its signals (column `opens`, floored to the provider's
    precision), plus `lookback` before the earliest one."""
    windows: dict[str, datetime] = {}
    for r in rows:
        start = floor_to(r[opens].astimezone(UTC), precision)
        recipient = r["recipient"].lower()
        windows[recipient] = min(start, windows.get(recipient, start))
    return SearchQuery(
        since=_minus(min(windows.values()), lookback),
        recipients=frozenset(windows),
        windows=windows,
    )


def criteria_for(
    signal: Mapping[Any, Any],
    precision: timedelta,
    *,
    received_after: datetime | None = None,
    text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES,
) -> Criteria:
    """The signal's criteria; `received_after` replaces its window's start;
    `body_contains` searches `text_max_bytes` (SIGNALBOX_MATCH_TEXT_MAX_BYTES)."""
    return Criteria(
        recipient=signal["recipient"],
        run_id=signal["run_id"],
        received_after=signal["received_after"] if received_after is None else received_after,
        subject_contains=signal["subject_contains"],
        body_contains=signal["body_contains"],
        require_run_marker=signal["require_run_marker"],
        precision=precision,
        text_max_bytes=text_max_bytes,
    )


def candidates_for(
    observed: Iterable[Observed], taken_by_other: Callable[[str], bool]
) -> list[Candidate]:
    """The observed messages as candidates; `taken_by_other(message_id)` says
    which are already another signal's."""
    return [
        Candidate(
            message_id=o.message_id,
            received_at=o.message.received_at.astimezone(UTC),
            mail=o.mail,
            envelope_recipients=tuple(a.lower() for a in o.message.envelope_recipients),
            taken_by_other=taken_by_other(o.message_id),
        )
        for o in observed
    ]
