"""`signalbox-server up`: every part as a child process of one supervisor,
on embedded PostgreSQL and Redis unless configured otherwise."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app.cli.ports import check_ports, wait_port, wait_ready
from app.cli.services import resolve_services
from app.settings import Settings, get_settings, usable_cores

DEV_TOKEN_FILE = "dev-token"
DEV_NAMESPACE = "default"
CHILDREN = ("api", "smtp", "worker", "beat", "flower")
# How long `up` waits for /readyz to answer 200 before its banner says it is not
# ready yet (a cold start on a busy machine: first migrations, workers warming).
READY_TIMEOUT_SECONDS = 180


def _ensure_dev_token(settings: Settings) -> str | None:
    """A development token for `up` when SIGNALBOX_API_TOKENS is unset; kept
    under the data dir so it survives restarts."""
    if settings.api_tokens:
        return None
    from app.infra.embedded import private_dir
    from app.usecases import tokens

    path = settings.data_dir / DEV_TOKEN_FILE
    kept = path.read_text().strip() if path.exists() else ""
    token = tokens.dev_token(DEV_NAMESPACE, kept)
    if token == kept:
        path.chmod(0o600)  # an earlier version may have left it wider
        return token
    private_dir(path.parent, tighten=False)
    _write_private(path, token + "\n")
    return token


def _write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable by its owner only from the start:
    a fresh file made 0600 at creation (O_EXCL: never someone else's file or
    link), then renamed over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o600)  # a umask may narrow it; it is exactly 0600
            handle.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def unsigned_webhook_warning(settings: Settings) -> str | None:
    """`up`'s stderr line when dead-letter webhooks would go out unsigned."""
    from app.domain.webhooks import unsigned_warning

    message = unsigned_warning(
        settings.dead_letter_webhook_url, settings.dead_letter_webhook_secret
    )
    return f"signalbox-server: warning: {message}" if message else None


def _child_env(name: str, settings: Settings) -> dict[str, str]:
    """The environment of one child of `up`.

    The API is told the other parts it runs with, so its /readyz checks them
    too, and gets `api_processes()` uvicorn processes unless told otherwise. Only
    the API serves SIGNALBOX_METRICS_PORT: the children share one metrics
    directory (`up` chose it before starting them), which the API serves.
    """
    env = os.environ.copy()
    if name == "api":
        env["SIGNALBOX_READY_PARTS"] = "smtp,worker,beat"
        env.setdefault("SIGNALBOX_API_WORKERS", str(api_processes()))
    else:
        env.pop("SIGNALBOX_METRICS_PORT", None)
    return env


def api_processes() -> int:
    """The API's uvicorn processes under `up`: half the usable cores, at least
    one. `up` runs the whole stack on one machine, and the sink, the workers
    and PostgreSQL need the other half: on 2 cores one API process spent a
    sixth less CPU per lifecycle than two, with a lower p99 (bench/HISTORY.md)."""
    return max(1, usable_cores() // 2)


def _plain_port_offers(settings: Settings) -> str:
    """What the plain SMTP port offers, and how many sink processes serve it, for the banner."""
    tls = {"on": "STARTTLS", "required": "STARTTLS required", "off": "no TLS"}[settings.smtp_tls]
    auth = {"optional": "AUTH optional", "required": "AUTH required", "off": "no AUTH"}
    n = settings.smtp_processes
    return f"{tls}, {auth[settings.smtp_auth]}, {n} process{'es' if n > 1 else ''}"


def _banner(settings: Settings, ready: bool, flower: bool, token: str | None) -> str:
    """What `up` prints once /readyz answers 200 (`ready`), or once it gave up waiting."""
    lines = [
        "Signalbox is up."
        if ready
        else (
            f"Signalbox started, but /readyz did not answer 200 within"
            f" {READY_TIMEOUT_SECONDS} s: see the parts it names"
            f" (curl http://{settings.api_host}:{settings.api_port}/readyz)."
        ),
        f"  API        http://{settings.api_host}:{settings.api_port}  (docs at /docs)",
        f"  SMTP sink  {settings.smtp_host}:{settings.smtp_port}  ({_plain_port_offers(settings)})",
    ]
    if settings.smtps_port:
        lines.append(f"  SMTPS      {settings.smtp_host}:{settings.smtps_port}  (implicit TLS)")
    if flower:
        lines.append(f"  Flower     http://{settings.flower_host}:{settings.flower_port}")
    if token:
        lines.append(f"  Dev token  {token}   (namespace '{DEV_NAMESPACE}')")
        url = f"http://{settings.api_host}:{settings.api_port}"
        # The SMTP address too: a client (or `demo`) of a second stack must
        # not send to the first stack's sink.
        lines.append(
            f"  export SIGNALBOX_URL={url} SIGNALBOX_TOKEN={token}"
            f" SIGNALBOX_SMTP_HOST={settings.smtp_host} SIGNALBOX_SMTP_PORT={settings.smtp_port}"
        )
    cli = Path(sys.executable).parent / "signalbox"
    if cli.exists():
        lines.append(f"  CLI        {cli}   (signalbox dlq list, signalbox evidence RUN_ID, …)")
    lines.append("Ctrl-C stops everything.")
    return "\n".join(lines)


def _supervise(procs: dict[str, subprocess.Popen[bytes]], stopping: threading.Event) -> int:
    """Wait for Ctrl-C (or SIGTERM) or a child's end; 1 if a child ended first."""
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
    return exit_code


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """Terminate the children, killing those still running after 15 s."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + 15
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


def parent_death_signal() -> Callable[[], None] | None:
    """On Linux, what makes a child get SIGTERM when `up` dies (even of
    SIGKILL): in their own process groups, they no longer die with its group."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here, not after the fork
    pr_set_pdeathsig = 1

    def set_it() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return set_it


def _start(name: str, args: argparse.Namespace, settings: Settings) -> subprocess.Popen[bytes]:
    """Start one child in a process group of its own: Ctrl-C at the terminal
    reaches `up` alone, which then stops each child with SIGTERM (a clean
    shutdown, no KeyboardInterrupt tracebacks from the children's own
    processes)."""
    cmd = [sys.executable, "-m", "app.cli", name]
    if name == "worker" and args.concurrency:
        cmd += ["--concurrency", str(args.concurrency)]
    return subprocess.Popen(
        cmd,
        env=_child_env(name, settings),
        process_group=0,
        # preexec_fn is safe here: `up` runs no threads of its own.
        preexec_fn=parent_death_signal(),
    )


def cmd_up(args: argparse.Namespace) -> int:
    from app.usecases import schema

    wanted = [c for c in CHILDREN if not (c == "flower" and args.no_flower)]
    warning = unsigned_webhook_warning(get_settings())
    if warning:
        print(warning, file=sys.stderr, flush=True)
    check_ports(get_settings(), [c for c in ("api", "smtp", "flower") if c in wanted] + ["metrics"])
    settings, handles = resolve_services(get_settings())
    schema.upgrade(settings.database_url or "")
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
        if name != "flower":
            procs[name] = _start(name, args, settings)
    # "up" only once every part answers: the API's /readyz checks the
    # database, the broker, the sink, the worker's and beat's heartbeats.
    ready = wait_port(settings.smtp_host, settings.smtp_port, READY_TIMEOUT_SECONDS) and wait_ready(
        f"http://{settings.api_host}:{settings.api_port}/readyz",
        READY_TIMEOUT_SECONDS,
        alive=lambda: not stopping.is_set() and all(p.poll() is None for p in procs.values()),
    )
    if "flower" in wanted and not stopping.is_set():
        # Last: Flower asks the workers for their state once, as it starts;
        # started before them it would only log that none answered.
        procs["flower"] = _start("flower", args, settings)
        wait_port(settings.flower_host, settings.flower_port, 60)
    if not stopping.is_set():
        print(_banner(settings, ready, "flower" in procs, token), flush=True)
    exit_code = _supervise(procs, stopping)
    _stop(procs)
    if handles is not None:
        handles.stop()
    return exit_code
