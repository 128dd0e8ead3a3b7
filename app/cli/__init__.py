"""`signalbox-server`: the operator's command.

`up` runs everything in one process group (API, SMTP sink, worker, beat,
Flower) on embedded PostgreSQL and Redis when none are configured; the other
commands run one part each.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.cli.admin import cmd_db_upgrade, cmd_probe, cmd_token_create
from app.cli.celery_commands import cmd_beat, cmd_flower, cmd_worker
from app.cli.demo import cmd_demo
from app.cli.serve import cmd_api, cmd_smtp
from app.cli.sink_processes import parse_process_arg
from app.cli.up import cmd_up
from app.errors import ConfigurationError
from app.settings import load_settings

EPILOG = (
    "Settings come from SIGNALBOX_* environment variables or config/signalbox.toml: "
    "SIGNALBOX_DATABASE_URL, SIGNALBOX_BROKER_URL, SIGNALBOX_REDIS_URL, "
    "SIGNALBOX_API_HOST/_PORT, SIGNALBOX_SMTP_HOST/_PORT, SIGNALBOX_SMTP_PROCESSES, "
    "SIGNALBOX_SMTP_DOMAINS, "
    "SIGNALBOX_API_TOKENS, SIGNALBOX_FLOWER_HOST/_PORT, SIGNALBOX_FLOWER_BASIC_AUTH, "
    "SIGNALBOX_DATA_DIR, SIGNALBOX_PROVIDERS_FILE."
)


def build_parser() -> argparse.ArgumentParser:
    """The command line: each subcommand's `func` runs it."""
    parser = argparse.ArgumentParser(prog="signalbox-server", description=__doc__, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="everything in one process group (embedded services by default)")
    up.add_argument("--no-flower", action="store_true", help="do not start Flower")
    up.add_argument("--concurrency", type=int, default=0, help="worker processes (default: cores)")
    up.set_defaults(func=cmd_up)
    sub.add_parser("api", help="the HTTP API").set_defaults(func=cmd_api)
    smtp = sub.add_parser(
        "smtp", help="the SMTP sink (SIGNALBOX_SMTP_PROCESSES processes, default: the cores)"
    )
    # Set by the sink's supervisor on each process it starts: this one is I of N.
    smtp.add_argument("--process", type=parse_process_arg, default=None, help=argparse.SUPPRESS)
    smtp.set_defaults(func=cmd_smtp)
    worker = sub.add_parser("worker", help="a Celery worker")
    worker.add_argument("--concurrency", type=int, default=0)
    worker.add_argument("--queues", default="signals,dead_letter")
    worker.add_argument("--name", default=None)
    worker.set_defaults(func=cmd_worker)
    sub.add_parser("beat", help="Celery beat: the sweep and retention").set_defaults(func=cmd_beat)
    sub.add_parser("flower", help="Flower, with SIGNALBOX_FLOWER_BASIC_AUTH").set_defaults(
        func=cmd_flower
    )
    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_sub.add_parser("upgrade", help="apply migrations")
    upgrade.add_argument("revision", nargs="?", default="head")
    upgrade.set_defaults(func=cmd_db_upgrade)
    token = sub.add_parser("token", help="API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token for a namespace; prints it once")
    create.add_argument("--namespace", required=True)
    create.set_defaults(func=cmd_token_create)
    probe = sub.add_parser("probe", help="liveness of a worker or beat here (exit 0 alive, 1 not)")
    probe.add_argument("part", choices=["worker", "beat"])
    probe.add_argument("--max-age", type=float, default=0, help="seconds (default: per part)")
    probe.set_defaults(func=cmd_probe)
    sub.add_parser("demo", help="one signal end to end against the running stack").set_defaults(
        func=cmd_demo
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (2: a setting is wrong, with one line saying which)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        load_settings()
    except ConfigurationError as exc:
        print(f"signalbox-server: {exc.message}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigurationError as exc:
        print(f"signalbox-server: {exc.message}", file=sys.stderr)
        return 2
