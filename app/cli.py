"""`signalbox-server`: the operator's command.

`up` runs everything in one process group (API, SMTP sink, worker, beat,
Flower) on embedded PostgreSQL and Redis when none are configured; the other
commands run one part each.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.errors import ConfigurationError
from app.settings import Settings, get_settings, load_settings

if TYPE_CHECKING:
    from app.infra.embedded import EmbeddedServices

DEV_TOKEN_FILE = "dev-token"
DEV_NAMESPACE = "default"
CHILDREN = ("api", "smtp", "worker", "beat", "flower")


def _env_help(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Settings come from SIGNALBOX_* environment variables or config/signalbox.toml: "
        "SIGNALBOX_DATABASE_URL, SIGNALBOX_BROKER_URL, SIGNALBOX_REDIS_URL, "
        "SIGNALBOX_API_HOST/_PORT, SIGNALBOX_SMTP_HOST/_PORT, SIGNALBOX_SMTP_DOMAINS, "
        "SIGNALBOX_API_TOKENS, SIGNALBOX_FLOWER_HOST/_PORT, SIGNALBOX_FLOWER_BASIC_AUTH, "
        "SIGNALBOX_DATA_DIR, SIGNALBOX_PROVIDERS_FILE."
    )


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def resolve_services(settings: Settings) -> tuple[Settings, EmbeddedServices | None]:
    """Start embedded PostgreSQL/Redis for what is not configured, export the
    URLs to the environment (children inherit them), return fresh settings.

    Redis is needed even with another broker (RabbitMQ): the circuit breaker
    keeps its state there. Without SIGNALBOX_REDIS_URL it is the broker when
    that is Redis, else the embedded one.
    """
    from app.infra.embedded import embedded_redis_url, ensure_services

    broker = settings.broker_url
    redis_url = settings.redis_url or (broker if broker and broker.startswith("redis") else None)
    embedded_redis = embedded_redis_url(settings.data_dir, settings.embedded_redis_port)
    if not redis_url and embedded_redis and _redis_answers(embedded_redis):
        redis_url = embedded_redis  # `up` already runs it: share it
    if not redis_url and not _port_free("127.0.0.1", settings.embedded_redis_port):
        raise ConfigurationError(
            f"port {settings.embedded_redis_port} on 127.0.0.1 is taken by something other than"
            " this data directory's Redis: set SIGNALBOX_EMBEDDED_REDIS_PORT to a free port,"
            " or SIGNALBOX_REDIS_URL to a Redis to use"
        )
    handles = None
    database_url = settings.database_url
    if not database_url or not redis_url:
        handles = ensure_services(
            database_url=database_url,
            broker_url=redis_url,
            data_dir=settings.data_dir,
            redis_port=settings.embedded_redis_port,
        )
        database_url, redis_url = handles.database_url, handles.redis_url
    os.environ["SIGNALBOX_DATABASE_URL"] = database_url or ""
    os.environ["SIGNALBOX_BROKER_URL"] = broker or redis_url or ""
    os.environ["SIGNALBOX_REDIS_URL"] = redis_url or ""
    get_settings.cache_clear()
    return get_settings(), handles


def _ensure_dev_token(settings: Settings) -> str | None:
    """A development token for `up` when SIGNALBOX_API_TOKENS is unset; kept
    under the data dir so it survives restarts."""
    if settings.api_tokens:
        return None
    from app.db import tokens as tokens_db
    from app.db.engine import transaction
    from app.domain.ids import token_hash

    path = settings.data_dir / DEV_TOKEN_FILE
    token = path.read_text().strip() if path.exists() else ""
    with transaction() as session:
        if token and tokens_db.token_namespace(session, token_hash(token)) is not None:
            return token
        token = "sbx_dev_" + secrets.token_urlsafe(24)
        tokens_db.token_create(session, DEV_NAMESPACE, token_hash(token))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def _wait_port(host: str, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _check_port(host: str, port: int | None, setting: str) -> None:
    """Fail with one line naming `setting` if the port cannot be listened on."""
    if port is None:
        return
    if port == 0:
        raise ConfigurationError(
            f"{setting}=0 is not allowed (clients must know the port): set {setting} to a free port"
        )
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {host}:{port} ({exc.strerror}): check the host beside {setting}"
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigurationError(
                f"port {port} on {host} is not free ({exc.strerror}):"
                f" set {setting} to a free port, or stop what listens there"
            ) from None


def _check_ports(settings: Settings, parts: Sequence[str]) -> None:
    """Every port the given parts will listen on, before anything starts."""
    wanted = {
        "api": (settings.api_host, settings.api_port, "SIGNALBOX_API_PORT"),
        "smtp": (settings.smtp_host, settings.smtp_port, "SIGNALBOX_SMTP_PORT"),
        "flower": (settings.flower_host, settings.flower_port, "SIGNALBOX_FLOWER_PORT"),
        "metrics": (settings.metrics_host, settings.metrics_port, "SIGNALBOX_METRICS_PORT"),
    }
    for part in parts:
        host, port, setting = wanted[part]
        _check_port(host, port, setting)


def _api_workers(settings: Settings, default: int) -> int:
    return settings.api_workers or default


def cmd_up(args: argparse.Namespace) -> int:
    from app.db.migrate import upgrade

    wanted = [c for c in CHILDREN if not (c == "flower" and args.no_flower)]
    _check_ports(
        get_settings(), [c for c in ("api", "smtp", "flower") if c in wanted] + ["metrics"]
    )
    settings, handles = resolve_services(get_settings())
    upgrade(settings.database_url or "")
    from app.observability.metrics import compact_dead_processes

    # Before the children start: fold the metric files a previous run left.
    compact_dead_processes()
    token = _ensure_dev_token(settings)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = threading.Event()

    def stop_all(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)
    for name in wanted:
        cmd = [sys.executable, "-m", "app.cli", name]
        if name == "worker" and args.concurrency:
            cmd += ["--concurrency", str(args.concurrency)]
        procs[name] = subprocess.Popen(cmd, env=_child_env(name, settings))
    ready = _wait_port(settings.api_host, settings.api_port, 120) and _wait_port(
        settings.smtp_host, settings.smtp_port, 120
    )
    lines = [
        "Signalbox is up."
        if ready
        else "Signalbox started, but the API or SMTP did not answer yet.",
        f"  API        http://{settings.api_host}:{settings.api_port}  (docs at /docs)",
        f"  SMTP sink  {settings.smtp_host}:{settings.smtp_port}",
    ]
    if "flower" in procs:
        lines.append(f"  Flower     http://{settings.flower_host}:{settings.flower_port}")
    if token:
        lines.append(f"  Dev token  {token}   (namespace '{DEV_NAMESPACE}')")
        url = f"http://{settings.api_host}:{settings.api_port}"
        lines.append(f"  export SIGNALBOX_URL={url} SIGNALBOX_TOKEN={token}")
    lines.append("Ctrl-C stops everything.")
    print("\n".join(lines), flush=True)
    exit_code = 0
    while not stopping.is_set():
        for name, proc in procs.items():
            # A child that ends after Ctrl-C (the whole group got it) is no failure.
            if proc.poll() is not None and not stopping.is_set():
                print(
                    f"signalbox-server: {name} exited with {proc.returncode}; stopping",
                    file=sys.stderr,
                )
                exit_code = 1
                stopping.set()
                break
        stopping.wait(0.5)
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 15
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    if handles is not None:
        handles.stop()
    return exit_code


def _child_env(name: str, settings: Settings) -> dict[str, str]:
    """The environment of one child of `up`.

    The API is told the other parts it runs with, so its /readyz checks them
    too, and gets one uvicorn process per core unless told otherwise. Only
    the API serves SIGNALBOX_METRICS_PORT: the children share one metrics
    directory (`up` chose it before starting them), which the API serves.
    """
    env = os.environ.copy()
    if name == "api":
        env["SIGNALBOX_READY_PARTS"] = "smtp,worker,beat"
        env.setdefault("SIGNALBOX_API_WORKERS", str(os.cpu_count() or 1))
    else:
        env.pop("SIGNALBOX_METRICS_PORT", None)
    return env


def api_factory() -> Any:
    """The ASGI app of one uvicorn worker process (SIGNALBOX_API_WORKERS > 1)."""
    from app.api.app import create_app
    from app.observability.logs import configure_logging

    settings = get_settings()
    configure_logging("api", settings.log_level)
    return create_app(settings)


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn's worker processes, created with
    `IPPROTO_TCP`: asyncio sets TCP_NODELAY only on accepted sockets whose
    protocol says TCP, and uvicorn's own `bind_socket` leaves it 0, so every
    keep-alive response would wait ~40 ms for a delayed ACK (uvicorn #3149)."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from app.observability.exposition import serve_metrics_port

    _check_ports(get_settings(), ["api", "metrics"])
    settings, _handles = resolve_services(get_settings())
    workers = _api_workers(settings, 1)
    # Served by this (the supervising) process: it merges every uvicorn worker's files.
    serve_metrics_port(settings, "api")
    common: dict[str, Any] = {
        "host": settings.api_host,
        "port": settings.api_port,
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": 5,
    }
    if workers > 1:
        from uvicorn.supervisors import Multiprocess

        # Each worker process has its own long-poll notifier (LISTEN on PostgreSQL).
        config = uvicorn.Config("app.cli:api_factory", factory=True, workers=workers, **common)
        Multiprocess(config, sockets=[tcp_listener(settings.api_host, settings.api_port)]).run()
    else:
        uvicorn.run(api_factory(), **common)
    return 0


def cmd_smtp(args: argparse.Namespace) -> int:
    from app.observability.exposition import serve_metrics_port
    from app.observability.logs import configure_logging
    from app.smtp.server import make_controller

    _check_ports(get_settings(), ["smtp", "metrics"])
    settings, _handles = resolve_services(get_settings())
    configure_logging("smtp", settings.log_level)
    serve_metrics_port(settings, "smtp")
    controller = make_controller(settings)
    controller.start()
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    controller.stop()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    _check_ports(get_settings(), ["metrics"])
    resolve_services(get_settings())
    from workers.celery_app import get_celery

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
    from app.providers.bulkhead import PROCESSES_ENV

    # The pool processes' bulkhead (app/providers/bulkhead.py) is sized from this.
    os.environ[PROCESSES_ENV] = str(args.concurrency or os.cpu_count() or 1)
    get_celery().worker_main(argv)
    return 0


def cmd_beat(args: argparse.Namespace) -> int:
    _check_ports(get_settings(), ["metrics"])
    settings, _ = resolve_services(get_settings())
    from workers.celery_app import get_celery

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    get_celery().start(
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
    configure_logging("flower", settings.log_level)
    from workers.celery_app import get_celery

    # --quiet and --logging=none: no banner and no tornado log format; Flower
    # writes JSON lines through the handler configured above.
    argv = [
        "--quiet",
        "flower",
        f"--port={settings.flower_port}",
        f"--address={settings.flower_host}",
        "--logging=none",
    ]
    if settings.flower_basic_auth:
        argv.append(f"--basic-auth={settings.flower_basic_auth}")
    else:
        print(
            "signalbox-server: SIGNALBOX_FLOWER_BASIC_AUTH is not set: Flower's UI is open"
            " and its API refuses every call",
            file=sys.stderr,
        )
    get_celery().start(argv)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from app.db.migrate import upgrade

    settings, _ = resolve_services(get_settings())
    upgrade(settings.database_url or "", args.revision)
    print(f"database at {args.revision}")
    return 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from app.db import tokens as tokens_db
    from app.db.engine import transaction
    from app.domain.ids import token_hash

    resolve_services(get_settings())
    token = "sbx_" + secrets.token_urlsafe(32)
    with transaction() as session:
        tokens_db.token_create(session, args.namespace, token_hash(token))
    print(token)
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


def cmd_demo(args: argparse.Namespace) -> int:
    from app.demo import run_demo

    return run_demo(get_settings())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="signalbox-server", description=__doc__)
    _env_help(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="everything in one process group (embedded services by default)")
    up.add_argument("--no-flower", action="store_true", help="do not start Flower")
    up.add_argument("--concurrency", type=int, default=0, help="worker processes (default: cores)")
    up.set_defaults(func=cmd_up)
    sub.add_parser("api", help="the HTTP API").set_defaults(func=cmd_api)
    sub.add_parser("smtp", help="the SMTP sink").set_defaults(func=cmd_smtp)
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


if __name__ == "__main__":
    sys.exit(main())
