"""Prometheus metrics of CONTRACT §7, recorded where the event happens.

Counters and histograms are process-local here; the operations work makes
them multiprocess-safe and adds the scrape-time gauges.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SIGNALS_CREATED = Counter(
    "signalbox_signals_created", "Signals created.", ["namespace"]
)
TIME_TO_FOUND = Histogram(
    "signalbox_signal_time_to_found_seconds",
    "From signal creation to its message found.",
    ["provider"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
)
CHECKS = Counter("signalbox_checks", "Checks by outcome.", ["provider", "outcome"])
PROVIDER_CALL = Histogram(
    "signalbox_provider_call_seconds",
    "Duration of one provider call.",
    ["provider"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
MISMATCHED = Counter(
    "signalbox_messages_mismatched", "Near misses by why.", ["provider", "why"]
)
LEASES_LAPSED = Counter("signalbox_leases_lapsed", "Claim leases that lapsed.", ["namespace"])


def signals_created(namespace: str) -> None:
    SIGNALS_CREATED.labels(namespace=namespace).inc()


def time_to_found(provider: str, seconds: float) -> None:
    TIME_TO_FOUND.labels(provider=provider).observe(max(0.0, seconds))


def check_recorded(provider: str, outcome: str) -> None:
    CHECKS.labels(provider=provider, outcome=outcome).inc()


def provider_call(provider: str, seconds: float) -> None:
    PROVIDER_CALL.labels(provider=provider).observe(seconds)


def mismatch(provider: str, why: str) -> None:
    MISMATCHED.labels(provider=provider, why=why).inc()


def lease_lapsed(namespace: str) -> None:
    LEASES_LAPSED.labels(namespace=namespace).inc()
