"""Observability hooks of the Celery processes (worker and beat).

* Logs: Celery's `setup_logging` signal, when anyone listens, makes Celery
  leave logging alone; we install the JSON formatter of
  `app.observability.logs` instead, so worker, prefork children and beat
  write JSON lines like the API and the sink. The worker's banner (which
  prints the configuration) is silenced for the same reason.
* Metrics: the worker's main process folds the metric files of processes
  that ended into the archive before forking its children, and each child
  does prometheus_client's bookkeeping when it exits. With
  SIGNALBOX_METRICS_PORT the worker's main process (and beat) serves the
  merged metrics of its process tree on that port.
* Heartbeats (`app.observability.heartbeat`): the worker's consumer touches
  its file at each event heartbeat, beat at each task it sends; they answer
  the liveness probes and `/readyz` under `up`.

`install()` is called once by `workers.celery_app`; connecting twice is harmless
(Celery's signals deduplicate receivers by identity).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

# isort: off
# First of all: Celery's command line module loads its plugins, Flower among
# them, which imports prometheus_client, and the metrics module must select
# multiprocess mode before that (see app.observability.metrics).
# `signalbox-server worker|beat` import it themselves before that command line
# names this app (`-A workers.celery_app`); importing it here keeps it first for
# a process that imports workers.celery_app before any command line runs.
from app.observability import metrics

# isort: on
from celery import signals

from app.observability.logs import configure_logging, formatter_for


def _component() -> str:
    # Celery's setup_logging signal does not say which program runs; the
    # command line does (`python -m app.cli worker`, `celery ... beat`).
    for word in sys.argv[1:]:
        if word in ("worker", "beat", "flower"):
            return word
    return "celery"


def _log_format() -> str | None:
    """SIGNALBOX_LOG_FORMAT from the settings (None: the environment decides)."""
    try:
        from app.settings import get_settings

        return get_settings().log_format
    except Exception:  # a bad setting fails elsewhere, with its name; logging still works
        return None


def _setup_logging(loglevel: Any = None, **_: Any) -> None:
    # SIGNALBOX_LOG_LEVEL wins over Celery's --loglevel, so that every process
    # of a deployment logs alike; Celery's is the fallback for `celery ...` runs.
    level = os.environ.get("SIGNALBOX_LOG_LEVEL")
    if not level and isinstance(loglevel, int):
        level = logging.getLevelName(loglevel)
    configure_logging(_component(), level or None, _log_format())
    # Beat logs every task it sends (a sweep a second): keep its warnings only;
    # `_beat_started` says that it runs.
    logging.getLogger("celery.beat").setLevel(logging.WARNING)


def _beat_started(**_: Any) -> None:
    logging.getLogger("signalbox.beat").info(
        "beat started", extra={"event": "beat_started", "component": "beat"}
    )


def _json_task_logger(logger: Any = None, **_: Any) -> None:
    # Only reached if Celery configured its task logger itself (someone
    # disconnected `_setup_logging`): keep its lines JSON as well.
    for handler in getattr(logger, "handlers", []):
        handler.setFormatter(formatter_for(_component(), getattr(handler, "stream", None)))


def _early_worker_setup(instance: Any = None, **_: Any) -> None:
    # Sent before Celery checks privileges and prints its banner: JSON
    # logging (and captured warnings) from here on, and no banner, which is
    # plain text and lists the broker and the tasks.
    _setup_logging()
    if instance is not None:
        instance.quiet = True


def _compact_metrics(**_: Any) -> None:
    if metrics.MULTIPROC_DIR is None:
        logging.getLogger("signalbox.metrics").warning(
            "metrics are process-local: prometheus_client was imported before"
            " app.observability.metrics; /metrics will miss this worker's counters",
            extra={"event": "metrics_not_multiprocess"},
        )
        return
    metrics.compact_dead_processes()


def _child_exited(pid: int | None = None, **_: Any) -> None:
    metrics.process_exited(pid or os.getpid())


def _settings() -> Any:
    from app.settings import get_settings

    return get_settings()


def _serve_metrics(component: str) -> None:
    from app.observability.exposition import serve_metrics_port

    try:
        serve_metrics_port(_settings(), component)
    except OSError as exc:
        settings = _settings()
        print(
            f"signalbox-server: {component}: cannot serve metrics on"
            f" {settings.metrics_host}:{settings.metrics_port} ({exc.strerror}):"
            " set SIGNALBOX_METRICS_PORT to a free port",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)


def _warn_unsigned_webhook() -> None:
    # Workers POST the dead-letter webhook and beat sends those tasks: both
    # say so at start when the deliveries would go out unsigned.
    from app.usecases import webhooks

    webhooks.warn_if_unsigned(_settings())


def _worker_started(**kwargs: Any) -> None:
    _compact_metrics(**kwargs)
    _warn_unsigned_webhook()
    _serve_metrics("worker")


def _child_started(**_: Any) -> None:
    # A prefork child inherited the main process's metrics socket: not its own.
    from app.observability.exposition import close_inherited_metrics_socket

    close_inherited_metrics_socket()


def _worker_heartbeat(**_: Any) -> None:
    from app.observability import heartbeat

    heartbeat.touch(_settings().data_dir, "worker")


def _beat_sent(**_: Any) -> None:
    from app.observability import heartbeat

    heartbeat.touch(_settings().data_dir, "beat")


def _beat_init(**kwargs: Any) -> None:
    _beat_started(**kwargs)
    # Only beat's own sends are its heartbeat (the API and workers publish too).
    signals.after_task_publish.connect(_beat_sent, weak=False)
    _beat_sent()
    _warn_unsigned_webhook()
    _serve_metrics("beat")


def install() -> None:
    """Connect the hooks (weak=False: the receivers are module functions anyway)."""
    signals.setup_logging.connect(_setup_logging, weak=False)
    signals.after_setup_task_logger.connect(_json_task_logger, weak=False)
    signals.celeryd_init.connect(_early_worker_setup, weak=False)
    signals.beat_init.connect(_beat_init, weak=False)
    signals.worker_init.connect(_worker_started, weak=False)
    signals.worker_process_init.connect(_child_started, weak=False)
    signals.worker_process_shutdown.connect(_child_exited, weak=False)
    # Connected before the worker builds its Heart, which only sends the
    # signal when it had receivers at that time.
    signals.heartbeat_sent.connect(_worker_heartbeat, weak=False)
