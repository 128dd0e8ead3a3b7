"""Moments and spans of time, as comparisons and sentences want them."""

from __future__ import annotations

from datetime import UTC, datetime


def as_utc(moment: datetime) -> datetime:
    # Comparing naive with aware datetimes raises; the server stores UTC, so a
    # naive value can only mean UTC.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def rounded_span(seconds: float) -> str:
    """`seconds` for a sentence: whole seconds under two minutes, whole
    minutes under two hours, else whole hours."""
    if seconds < 120:
        return f"{int(seconds + 0.5)} s"
    if seconds < 2 * 3600:
        return f"{int(seconds / 60 + 0.5)} min"
    return f"{int(seconds / 3600 + 0.5)} h"
