"""Prometheus exposition: `GET /metrics` of the API and the port of
SIGNALBOX_METRICS_PORT of every long-running process.

Counters and histograms come from the files of the processes that share this
process's metrics directory (multiprocess mode, see
`app.observability.metrics`): on one machine every process, in a pod this
process tree. The gauges describe shared state, so they are read at scrape
time from their source of truth: signals and dead letters from PostgreSQL,
breaker states from Redis. Only the processes that should serve them do
(SIGNALBOX_METRICS_DB_GAUGES; by default the API), so a deployment with many
pods can have them from one kind of process and not once per pod. A source
that does not answer is reported by `signalbox_scrape_source_up{source}` = 0
rather than by a failed scrape, so the counters stay visible during an outage.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# isort: off
# Imported first: it chooses multiprocess mode before prometheus_client loads.
from app.observability import metrics

# isort: on
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.domain.states import DeadLetterState, ExpiryReason, Status
from app.observability.logs import warn_unreachable
from app.settings import Settings
from app.usecases import gauges

log = logging.getLogger("signalbox.metrics")

# docs/api.md "Metrics": 0 closed, 1 half-open, 2 open.
CIRCUIT_VALUES = {"closed": 0, "half_open": 1, "open": 2}


class StateCollector(Collector):
    """The gauges of shared state, read from PostgreSQL and Redis at each scrape."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        source_up = GaugeMetricFamily(
            "signalbox_scrape_source_up",
            "Whether the scrape could read the gauges' source (1) or not (0).",
            labels=["source"],
        )
        database = self._database()
        source_up.add_metric(["postgresql"], 0.0 if database is None else 1.0)
        if database is not None:
            yield from database
        circuits = self._circuits()
        source_up.add_metric(["redis"], 0.0 if circuits is None else 1.0)
        if circuits is not None:
            yield circuits
        yield source_up

    def _database(self) -> list[GaugeMetricFamily] | None:
        try:
            stored = gauges.stored_state()
        except Exception as exc:  # an outage is reported as a gauge, not a failed scrape
            warn_unreachable(
                log, "metrics could not read PostgreSQL", "metrics_source_down", "postgresql", exc
            )
            return None
        by_status, dead = stored.signals_by_status, stored.dead_letters
        signals = GaugeMetricFamily("signalbox_signals", "Signals by status.", labels=["status"])
        # Every status is present, zeros included, so alerts need no `absent()`.
        for status in [*Status, *sorted(set(by_status) - set(Status))]:
            signals.add_metric([str(status)], float(by_status.get(str(status), 0)))
        oldest_due = GaugeMetricFamily(
            "signalbox_oldest_due_signal_age_seconds",
            "How long the oldest waiting signal has been due for a check (0 when none is due).",
            value=stored.oldest_due_seconds,
        )
        dead_letters = GaugeMetricFamily(
            "signalbox_dead_letters",
            "Dead letters by reason, state and namespace.",
            labels=["reason", "state", "namespace"],
        )
        # Zeros for every reason and state of each namespace that has dead
        # letters or a configured token, so alerts need no `absent()`.
        namespaces = {ns for _, _, ns in dead} | set(self.settings.token_map.values())
        triples = {
            (str(r), str(s), ns) for r in ExpiryReason for s in DeadLetterState for ns in namespaces
        } | set(dead)
        for reason, state, namespace in sorted(triples):
            dead_letters.add_metric(
                [reason, state, namespace], float(dead.get((reason, state, namespace), 0))
            )
        oldest_transaction = GaugeMetricFamily(
            "signalbox_db_oldest_transaction_age_seconds",
            "How long the database's oldest open transaction (any client) has been open:"
            " one left idle in transaction pins the xmin horizon and bloats the hot tables.",
            value=stored.oldest_transaction_seconds,
        )
        return [signals, oldest_due, dead_letters, oldest_transaction]

    def _circuits(self) -> GaugeMetricFamily | None:
        try:
            states = gauges.circuit_states(self.settings)
        except Exception as exc:
            warn_unreachable(
                log, "metrics could not read Redis", "metrics_source_down", "redis", exc
            )
            return None
        if states is None:
            return None
        gauge = GaugeMetricFamily(
            "signalbox_circuit_state",
            "Circuit breaker per provider: 0 closed, 1 half-open, 2 open.",
            labels=["provider"],
        )
        for name in sorted(set(states) | set(gauges.configured_providers(self.settings))):
            gauge.add_metric([name], float(CIRCUIT_VALUES.get(states.get(name, "closed"), 0)))
        return gauge


def serves_db_gauges(settings: Settings, component: str) -> bool:
    """Whether `component` serves the gauges read from PostgreSQL and Redis."""
    if settings.metrics_db_gauges is not None:
        return settings.metrics_db_gauges
    return component == "api"


def _registry(settings: Settings, component: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    if metrics.MULTIPROC_DIR is None:
        # Single-process fallback: this process's counters only.
        registry.register(_ProcessCounters())
    else:
        registry.register(_MergedProcesses(metrics.MULTIPROC_DIR))
    if serves_db_gauges(settings, component):
        registry.register(StateCollector(settings))
    return registry


def render_metrics(settings: Settings, component: str = "api") -> tuple[bytes, str]:
    """The Prometheus text of this process's metrics directory, and its content type."""
    return generate_latest(_registry(settings, component)), CONTENT_TYPE_LATEST


_served: dict[str, Any] = {}


def serve_metrics_port(settings: Settings, component: str) -> None:
    """Serve this process tree's metrics on SIGNALBOX_METRICS_PORT, if set, from
    a daemon thread. A port in use stops the process with a line naming the
    setting (see `app.cli`)."""
    if settings.metrics_port is None or component in _served:
        return
    from prometheus_client import start_http_server

    server, _thread = start_http_server(
        settings.metrics_port,
        addr=settings.metrics_host,
        registry=_registry(settings, component),
    )
    _served[component] = server
    log.info(
        "metrics served",
        extra={"event": "metrics_served", "component": component, "port": settings.metrics_port},
    )


def close_inherited_metrics_socket() -> None:
    """In a forked child (a Celery prefork child): close the parent's
    listening socket, which the child inherited but never serves."""
    for server in _served.values():
        with contextlib.suppress(OSError):
            server.socket.close()
    _served.clear()


class _MergedProcesses(Collector):
    """Every process's counters and histograms, merged; a contract metric that
    no process has recorded yet is still declared (HELP and TYPE, no sample),
    so dashboards and alert rules see the name from the first scrape. Read
    under the lock compaction takes, so a scrape never sees a dead process's
    counts both in its file and in the archive."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._files = MultiProcessCollector(None, path=str(path))

    def collect(self) -> Iterator[Metric]:
        with metrics.files_lock(self._path, exclusive=False):
            families = list(self._files.collect())
        seen = set()
        for family in families:
            seen.add(family.name)
            yield family
        for declared in metrics.DECLARED:
            if declared._name not in seen:
                yield Metric(declared._name, declared._documentation, declared._type)


class _ProcessCounters(Collector):
    """The default registry's signalbox metrics, for the single-process fallback."""

    def collect(self) -> Iterator[Any]:
        for family in REGISTRY.collect():
            if family.name.startswith("signalbox_"):
                yield family
