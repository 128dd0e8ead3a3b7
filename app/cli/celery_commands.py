"""`signalbox-server worker`, `beat` and `flower`: Celery's own command line,
run in this process on the worker front door's app, named by its module
(`-A workers.celery_app`) so that nothing under app/ imports the workers.

Import order matters (see app.observability.metrics): prometheus_client
chooses multiprocess mode once, when first imported, and Celery's command
line module imports it as it loads its plugins (Flower among them). So the
worker and beat import app.observability.metrics before that module loads;
Flower imports prometheus_client first, on purpose.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from app.cli.ports import check_ports
from app.cli.services import resolve_services
from app.infra.embedded import private_dir
from app.settings import get_settings

CELERY_APP = "workers.celery_app"


def _celery(argv: list[str]) -> None:
    """Run `celery -A workers.celery_app <argv>` in this process."""
    from celery.bin.celery import celery
    from click.exceptions import Exit

    # An Exit ends the command, as in Celery's own `Celery.start`; its status
    # is not passed on: the command exits 0 once Celery returns.
    with contextlib.suppress(Exit):
        celery.main(args=["-A", CELERY_APP, *argv], standalone_mode=False)


def cmd_worker(args: argparse.Namespace) -> int:
    check_ports(get_settings(), ["metrics"])
    resolve_services(get_settings())
    import app.observability.metrics  # noqa: F401  # before Celery's plugins (module docstring)
    from app.providers.bulkhead import PROCESSES_ENV

    argv = [
        "worker",
        "--loglevel",
        "INFO",
        "-Q",
        args.queues,
        "-n",
        args.name or f"signalbox-{os.getpid()}@%h",
        "--without-gossip",
        "--without-mingle",
    ]
    if args.concurrency:
        argv += ["--concurrency", str(args.concurrency)]
    # The pool processes' bulkhead (app/providers/bulkhead.py) is sized from this.
    os.environ[PROCESSES_ENV] = str(args.concurrency or os.cpu_count() or 1)
    _quiet_root_warning()
    _celery(argv)
    return 0


def _stop_flower_cleanly_on_sigterm() -> None:
    """Flower's SIGTERM handler raises SystemExit wherever the signal lands;
    inside a weakref callback Python prints it as a traceback, ignores it,
    and Flower runs on until it is killed. Its event loop is asked to stop
    instead, and its command returns (then exits 0)."""
    import flower.command
    from tornado.ioloop import IOLoop

    def stop_loop(signum: int, frame: object) -> None:
        loop = IOLoop.current(instance=False)
        if loop is None:  # not serving yet
            raise SystemExit(0)
        loop.asyncio_loop.call_soon_threadsafe(loop.stop)  # type: ignore[attr-defined]

    flower.command.sigterm_handler = stop_loop  # read when Flower installs it


def _quiet_root_warning() -> None:
    """No SecurityWarning at start when the worker runs as root (a developer's
    `up`, a root container). What Celery warns of, a pickled message running
    code with root's rights, cannot happen here: the worker accepts JSON only
    (app.infra.queue), and Celery itself refuses to start as root when pickle is
    accepted. Run the worker unprivileged in production (docs/operations.md)."""
    import warnings

    from celery.exceptions import SecurityWarning

    from app.infra.queue import get_celery

    if "pickle" not in get_celery().conf.accept_content:
        warnings.filterwarnings("ignore", category=SecurityWarning)


def cmd_beat(args: argparse.Namespace) -> int:
    check_ports(get_settings(), ["metrics"])
    settings, _ = resolve_services(get_settings())
    import app.observability.metrics  # noqa: F401  # before Celery's plugins (module docstring)

    # Private from creation: beat's schedule files are made with the umask's mode.
    private_dir(settings.data_dir, tighten=False)
    _celery(
        # --quiet: no plain-text banner; beat logs JSON lines (workers.logging_setup).
        [
            "--quiet",
            "beat",
            "--loglevel",
            "WARNING",
            "-s",
            str(settings.data_dir / "celerybeat-schedule"),
        ]
    )
    return 0


def cmd_flower(args: argparse.Namespace) -> int:
    """Flower on SIGNALBOX_FLOWER_PORT, behind SIGNALBOX_FLOWER_BASIC_AUTH when set."""
    # Flower's own Prometheus metrics stay in this process: it must not join
    # the deployment's metric files, so prometheus_client is loaded before
    # anything of ours could switch it to multiprocess mode.
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    import prometheus_client  # noqa: F401

    from app.observability.logs import configure_logging

    settings, _ = resolve_services(get_settings())
    configure_logging("flower", settings.log_level, settings.log_format)
    # --quiet and --logging=none: no banner and no tornado log format; Flower
    # writes JSON lines through the handler configured above.
    argv = [
        "--quiet",
        "flower",
        f"--port={settings.flower_port}",
        f"--address={settings.flower_host}",
        "--logging=none",
        # Flower asks the workers for their state as it starts; a busy machine's
        # worker may take more than Flower's default second to answer.
        "--inspect_timeout=3000",
    ]
    if settings.flower_basic_auth:
        argv.append(f"--basic-auth={settings.flower_basic_auth}")
    else:
        print(
            "signalbox-server: SIGNALBOX_FLOWER_BASIC_AUTH is not set: Flower's UI is open"
            " and its API refuses every call",
            file=sys.stderr,
        )
    _stop_flower_cleanly_on_sigterm()
    _celery(argv)
    return 0
