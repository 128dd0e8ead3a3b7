"""What a worker process's tasks are given, built once per process: the
check runner with this process's providers, breakers and bulkheads."""

from __future__ import annotations

from app.infra.redis import redis_client
from app.providers.bulkhead import Bulkhead, default_limit
from app.settings import Settings, get_settings
from app.usecases.checks import CheckRunner, process_runner


class WorkerBulkheads:
    """The bulkheads of one worker (shared by its pool processes), by provider."""

    def __init__(self, worker: str) -> None:
        self.worker = worker

    def __call__(self, provider: str) -> Bulkhead:
        return Bulkhead(
            redis_client(),
            self.worker,
            provider,
            limit=default_limit(),
            lease_seconds=get_settings().check_lease_seconds,
        )


# Runners built, by worker name ("" for the sweep's): rebuilt only when the
# process's settings are (tests clear `get_settings`).
_BUILT: dict[str, tuple[Settings, CheckRunner]] = {}


def _runner(worker: str) -> CheckRunner:
    settings = get_settings()
    built = _BUILT.get(worker)
    if built is None or built[0] is not settings:
        bulkheads = WorkerBulkheads(worker) if worker else None
        built = _BUILT[worker] = (settings, process_runner(settings, bulkheads=bulkheads))
    return built[1]


def worker_runner(worker: str) -> CheckRunner:
    """The runner of this process's checks, for the worker named `worker`."""
    return _runner(worker or "worker")


def sweep_runner() -> CheckRunner:
    """The runner of the checks a sweep makes itself (beat, or a worker's sweep task)."""
    return _runner("")
