"""`GET /metrics`: the process's counters plus gauges computed at scrape time."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from app.settings import Settings


def render_metrics(settings: Settings) -> tuple[bytes, str]:
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
