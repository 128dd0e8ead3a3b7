"""The one-shot commands of an operator: `db upgrade`, `token create` and
`probe` (a pod's liveness answer)."""

from __future__ import annotations

import argparse

from app.cli.services import resolve_services
from app.settings import get_settings


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from app.usecases import schema

    settings, _ = resolve_services(get_settings())
    schema.upgrade(settings.database_url or "", args.revision)
    print(f"database at {args.revision}")
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from app.usecases import tokens

    resolve_services(get_settings())
    print(tokens.create(args.namespace))
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """Liveness of a worker or beat on this machine (or in this pod): is its
    heartbeat file fresh? Exit 0 if so, else 1 with one line saying why."""
    from app.observability import heartbeat

    settings = get_settings()
    limit = args.max_age or heartbeat.max_age(args.part, settings.sweep_interval_seconds)
    age = heartbeat.newest_age(settings.data_dir, args.part)
    if age is None:
        print(f"{args.part}: no heartbeat under {heartbeat.heartbeat_dir(settings.data_dir)}")
        return 1
    if age > limit:
        print(f"{args.part}: last heartbeat {age:.0f} s ago (limit {limit:.0f} s)")
        return 1
    print(f"{args.part}: alive (heartbeat {age:.1f} s ago)")
    return 0
