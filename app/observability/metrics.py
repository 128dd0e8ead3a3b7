"""Prometheus metrics of the contract: counters and histograms, recorded
where the event happens, in whichever process it happens.

Multiprocess mode. The API, the SMTP sink and every Celery prefork child are
separate processes, so each one writes its counters to its own memory-mapped
file and a scrape merges the files of a directory (see
`app.observability.exposition`). prometheus_client chooses between
process-local and file-backed values once, when it is first imported, from
``PROMETHEUS_MULTIPROC_DIR``: this module sets that variable *before* importing
it, so every process that records a metric (all of them import this module
first) is in multiprocess mode.

Which directory:

* one machine (`up`, or processes without SIGNALBOX_METRICS_PORT): every
  process of the data directory shares ``SIGNALBOX_DATA_DIR/metrics`` and the
  API's ``/metrics`` serves them all;
* a pod or a container (SIGNALBOX_METRICS_PORT set): each process tree (a
  worker and its prefork children, the API and its uvicorn workers) has a
  private directory under it and serves it on its own port. No directory is
  shared between containers.

The gauges (signals by status, oldest due signal, dead letters, circuit
state) are not recorded here: they are computed at scrape time from
PostgreSQL and Redis by the processes that serve them
(SIGNALBOX_METRICS_DB_GAUGES).

Files of dead processes are folded into one archive file per type by
`compact_dead_processes` (at `up` and at worker start), so counters stay
monotonic across restarts of a child and the directory does not grow with
every restarted child.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("signalbox.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Set by the first process of a process tree that serves its own metrics
# (SIGNALBOX_METRICS_PORT); its children (Celery prefork children, uvicorn
# workers) inherit it and write into the same private directory.
TREE_ENV = "SIGNALBOX_METRICS_TREE_DIR"
METRICS_SUBDIR = "metrics"
_TREE_PREFIX = "process-"
# Not `*.db`: prometheus_client reads every `*.db` file of the directory.
_LOCK_NAME = ".compact.lock"
_ARCHIVE_ID = "archive"
# Only these types are summed across processes; gauges would be per pid.
_SUMMED_TYPES = ("counter", "histogram")


def metrics_dir(data_dir: Path | str) -> Path:
    """Where the processes of the deployment using `data_dir` keep their metric files."""
    return Path(data_dir).absolute() / METRICS_SUBDIR


def _private_dir(path: Path, data_dir: Path | None = None) -> Path:
    """Make `path` (and `data_dir` above it, if missing) 0700, from creation.

    Metric files name every namespace and provider of the deployment;
    prometheus_client creates them with the mode the umask allows, so the
    directories around them are what keeps other users out.
    """
    from app.infra.embedded import private_dir

    if data_dir is not None:
        private_dir(data_dir, tighten=False)
    return private_dir(path)


def _configured() -> tuple[Path, bool]:
    """The data directory, and whether this process serves its own metrics port."""
    try:
        from app.settings import get_settings

        settings = get_settings()
        return settings.data_dir, settings.metrics_port is not None
    except Exception:  # invalid settings fail later, at the entry point, with their name
        data_dir = Path(os.environ.get("SIGNALBOX_DATA_DIR") or ".signalbox")
        return data_dir, bool(os.environ.get("SIGNALBOX_METRICS_PORT"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    # A killed worker's children can linger as zombies when nothing reaps
    # them (a container's init often does not): they count no more.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _private_tree_dir(shared: Path) -> Path:
    """A fresh directory for this process tree alone, under the shared one.

    Left-overs of trees whose first process is gone (a restarted container
    reusing its pid, an earlier run on the same data directory) are removed:
    their counts were served by a process that no longer exists.
    """
    import shutil

    for old in shared.glob(f"{_TREE_PREFIX}*"):
        pid = old.name.removeprefix(_TREE_PREFIX)
        if pid.isdigit() and (int(pid) == os.getpid() or not _pid_alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True)
    return _private_dir(shared / f"{_TREE_PREFIX}{os.getpid()}")


def _enable_multiprocess() -> Path | None:
    """Point prometheus_client at this process's metrics directory.

    * A child of a tree that serves its own metrics: the inherited private
      directory (SIGNALBOX_METRICS_TREE_DIR).
    * The first process of such a tree (SIGNALBOX_METRICS_PORT set): a new
      private directory, so a pod or a container never depends on files of
      another one.
    * Otherwise (one machine, `up`): the directory shared by every process
      of the data directory, which the API's /metrics merges.

    The shared directory follows SIGNALBOX_DATA_DIR, even over an inherited
    PROMETHEUS_MULTIPROC_DIR: a process started by another one (a test
    runner) must not write into its parent's deployment. Once
    prometheus_client is imported the choice is made; we keep it.
    """
    if "prometheus_client" in sys.modules:
        current = os.environ.get(MULTIPROC_ENV)
        return Path(current) if current else None
    data_dir, own_port = _configured()
    inherited = os.environ.get(TREE_ENV)
    try:
        if inherited:
            path = _private_dir(Path(inherited))
        elif own_port:
            _private_dir(metrics_dir(data_dir), Path(data_dir))
            path = _private_tree_dir(metrics_dir(data_dir))
            os.environ[TREE_ENV] = str(path)
        else:
            path = _private_dir(metrics_dir(data_dir), Path(data_dir))
    except OSError:
        os.environ.pop(MULTIPROC_ENV, None)
        return None  # process-local metrics beat no process at all
    os.environ[MULTIPROC_ENV] = str(path)
    return path


MULTIPROC_DIR = _enable_multiprocess()

from prometheus_client import Counter, Histogram, disable_created_metrics  # noqa: E402
from prometheus_client.mmap_dict import MmapedDict  # noqa: E402
from prometheus_client.multiprocess import mark_process_dead  # noqa: E402

# `_created` samples are meaningless once merged across processes.
disable_created_metrics()

# prometheus_client appends `_total` to counter names when it exposes them.
SIGNALS_CREATED = Counter("signalbox_signals_created", "Signals created.", ["namespace"])
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
MISMATCHED = Counter("signalbox_messages_mismatched", "Near misses by why.", ["provider", "why"])
LEASES_LAPSED = Counter("signalbox_leases_lapsed", "Claim leases that lapsed.", ["namespace"])
WEBHOOK_DELIVERIES = Counter(
    "signalbox_webhook_deliveries",
    "Dead-letter webhook attempts by outcome (delivered, failed, gave_up).",
    ["outcome"],
)
SMTP_REFUSED = Counter(
    "signalbox_smtp_refused",
    "Deliveries the SMTP sink refused, by reason (a TLS hello on the plain port too).",
    ["reason"],
)
DECLARED = (
    SMTP_REFUSED,
    SIGNALS_CREATED,
    TIME_TO_FOUND,
    CHECKS,
    PROVIDER_CALL,
    MISMATCHED,
    LEASES_LAPSED,
    WEBHOOK_DELIVERIES,
)


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


# Hostile mail: messages parsed on a bounded view, by the bound they hit
# (app.domain.mail reports every parse of this process to the observer).
MAIL_BOUNDS_EXCEEDED = Counter(
    "signalbox_mail_bounds_exceeded", "Messages parsed on a bounded view, by bound.", ["bound"]
)


def mail_bound_exceeded(bound: str) -> None:
    MAIL_BOUNDS_EXCEEDED.labels(bound=bound).inc()


def _observe_mail_bounds() -> None:
    from app.domain.mail import on_bound_exceeded

    on_bound_exceeded(mail_bound_exceeded)


_observe_mail_bounds()


def smtp_refused(reason: str) -> None:
    SMTP_REFUSED.labels(reason=reason).inc()


def webhook_delivery(outcome: str) -> None:
    WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()


# ---------------------------------------------------------------- the files


@contextlib.contextmanager
def files_lock(path: Path, *, exclusive: bool) -> Iterator[None]:
    """Readers (scrapes) share it; compaction takes it alone, so a scrape never
    sees a dead process's counts both in its file and in the archive."""
    fd = os.open(path / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    with open(fd, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_pid(path: Path) -> int | None:
    """The pid in `counter_123.db`, `gauge_livesum_123.db`; None for the archive."""
    last = path.stem.rsplit("_", 1)[-1]
    return int(last) if last.isdigit() else None


def process_exited(pid: int | None = None) -> None:
    """Bookkeeping when a process ends (a Celery child, a server): drop its
    live gauges. Its counters stay until compaction folds them into the archive."""
    if MULTIPROC_DIR is not None:
        mark_process_dead(pid or os.getpid(), str(MULTIPROC_DIR))


def compact_dead_processes(path: Path | None = None) -> int:
    """Fold the counter and histogram files of processes that no longer run
    into one archive file per type; return how many files were folded.

    Safe while other processes of the deployment run: live processes' files
    are never touched, the archive is replaced atomically, and scrapes wait
    on the lock. Pids are checked on this host only, which is right because
    the directory is local to the host.
    """
    path = path or MULTIPROC_DIR
    if path is None or not path.is_dir():
        return 0
    folded = 0
    with files_lock(path, exclusive=True):
        for typ in _SUMMED_TYPES:
            dead = [
                f
                for f in path.glob(f"{typ}_*.db")
                if (pid := _file_pid(f)) is not None and pid != os.getpid() and not _pid_alive(pid)
            ]
            if not dead:
                continue
            archive = path / f"{typ}_{_ARCHIVE_ID}.db"
            totals: dict[str, float] = {}
            for f in [archive, *dead] if archive.exists() else dead:
                for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(f)):
                    totals[key] = totals.get(key, 0.0) + value
            tmp = path / f"{typ}_{_ARCHIVE_ID}.tmp"
            tmp.unlink(missing_ok=True)
            # Made 0600 here: MmapedDict would create it with the umask's mode.
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            merged = MmapedDict(str(tmp))
            try:
                for key, value in totals.items():
                    merged.write_value(key, value, 0.0)
            finally:
                merged.close()
            os.replace(tmp, archive)
            for f in dead:
                f.unlink(missing_ok=True)
            folded += len(dead)
        for f in path.glob("gauge_*.db"):
            pid = _file_pid(f)
            if pid is not None and not _pid_alive(pid):
                mark_process_dead(pid, str(path))
    if folded:
        log.info(
            "metric files of ended processes folded",
            extra={"event": "metrics_compacted", "count": folded},
        )
    return folded
