"""Disk per stored message: what typical mails cost in PostgreSQL, by TOAST method.

    uv run python bench/storage.py [--count 100] [--methods none,pglz,lz4]
    uv run python bench/storage.py --count 20 --methods lz4   # quick
    uv run python bench/storage.py --database-url postgresql://postgres@127.0.0.1:5432/postgres

The embedded PostgreSQL is built without lz4 (its figures are skipped, and
named); `--database-url` runs the stack on another server instead, in a
database of its own created for the run and dropped after.

Starts `signalbox-server up` (embedded PostgreSQL and Redis, migrated: the
raw columns are lz4 where the server has it, migration 0016). For each
method, the two raw columns (`sink_messages.raw`, `messages.raw`) are set to
it (`none`: stored out of line uncompressed, STORAGE EXTERNAL, the floor to
compare with; `pglz`: PostgreSQL's default, what a column without a method
used before 0016; `lz4`) and, for each typical mail of `bench/_mails.py`
(a ~20 KB HTML newsletter, quoted-printable and base64; a plain
verification mail; a mail with a small PDF attached), `--count` full
lifecycles run through the real sink: POST /v1/signals (provider `sink`) →
the mail over SMTP → the long poll answers `found`. Each stored message is
then one `sink_messages` row and one `messages` row (what a check records).

Prints, per method and mail: the raw size, `pg_column_size(raw)` of each
copy (the bytes the value takes, compressed or not) and its share of the raw
size, the growth of each table per message (`pg_table_size`: heap, TOAST and
their maps; and `pg_total_relation_size`, with the indexes), then what
compressing and reading back costs the server per message (INSERT and
`md5(raw)` of the stored newsletters into a scratch table with that
method), and the machine. TOAST compresses only a row over about 2 kB, and
keeps the compressed form only when it is smaller.

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import smtplib
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _machine
import _mails
import _stack
import httpx
import psycopg
from _stack import HOST

METHODS = ("none", "pglz", "lz4")
TABLES = ("sink_messages", "messages")
LONG_POLL_SECONDS = 30
SMTP_TIMEOUT_SECONDS = 60
# The goal of the figures: a typical 20 KB HTML mail costs at most half its
# raw size in PostgreSQL (each stored copy).
GOAL_MAIL = "html newsletter (QP)"


@dataclass
class Phase:
    method: str
    mail: str
    count: int
    found: int
    raw_bytes: float  # average octet_length(raw)
    stored: dict[str, float]  # table → average pg_column_size(raw)
    compression: dict[str, str]  # table → methods the values were stored with
    table_growth: dict[str, int]  # table → pg_table_size delta
    total_growth: dict[str, int]  # table → pg_total_relation_size delta
    seconds: float
    recipients: list[str]
    error: str = ""


@dataclass
class Cost:
    method: str
    insert_us: float
    read_us: float
    messages: int


def set_method(conn: psycopg.Connection[Any], method: str) -> None:
    for table in TABLES:
        if method == "none":
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN raw SET STORAGE EXTERNAL")
        else:
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN raw SET STORAGE EXTENDED")
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN raw SET COMPRESSION {method}")


def sizes(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    out = {}
    for table in TABLES:
        row = conn.execute(
            "SELECT pg_table_size(%s::regclass), pg_total_relation_size(%s::regclass)",
            [table, table],
        ).fetchone()
        assert row is not None
        out[table] = (int(row[0]), int(row[1]))
    return out


def lifecycle(api: httpx.Client, smtp_port: int, recipient: str, raw: bytes, run_id: str) -> str:
    """One full lifecycle; its result (`found`) or an error's name."""
    try:
        created = api.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": recipient.split("@", 1)[0],
                "recipient": recipient,
                "expires_in_seconds": 120,
            },
        )
        created.raise_for_status()
        signal_id = created.json()["signal_id"]
        with smtplib.SMTP(HOST, smtp_port, timeout=SMTP_TIMEOUT_SECONDS) as smtp:
            smtp.sendmail("news@shop.example.test", [recipient], raw)
        view = api.get(f"/v1/signals/{signal_id}", params={"wait": LONG_POLL_SECONDS})
        view.raise_for_status()
        return str(view.json()["result"])
    except (httpx.HTTPError, smtplib.SMTPException, OSError, KeyError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def run_phase(
    stack: _stack.UpStack, conn: psycopg.Connection[Any], method: str, mail: str, args: Any
) -> Phase:
    build = _mails.TYPICAL[mail]
    slug = re.sub(r"[^a-z0-9]+", "-", mail.lower()).strip("-")
    run_id = f"storage-{uuid.uuid4().hex[:8]}"
    recipients = [f"{method}-{slug}-{i}-{run_id}@example.test" for i in range(args.count)]
    mails = [build(r, None) for r in recipients]
    before = sizes(conn)
    local = threading.local()
    clients: list[httpx.Client] = []

    def one(i: int) -> str:
        api = getattr(local, "api", None)
        if api is None:
            api = local.api = stack.client()
            clients.append(api)
        return lifecycle(api, stack.smtp_port, recipients[i], mails[i], run_id)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        results = list(pool.map(one, range(args.count)))
    seconds = time.perf_counter() - started
    for api in clients:
        api.close()
    after = sizes(conn)
    stored: dict[str, float] = {}
    compression: dict[str, str] = {}
    raw_bytes = 0.0
    for table, column in (("sink_messages", "all_recipients"), ("messages", "recipients")):
        row = conn.execute(
            f"SELECT avg(octet_length(raw)), avg(pg_column_size(raw)),"
            f" string_agg(DISTINCT coalesce(pg_column_compression(raw), 'uncompressed'), '+')"
            f" FROM {table} WHERE {column} && %s",
            [recipients],
        ).fetchone()
        assert row is not None
        raw_bytes = float(row[0] or 0)
        stored[table] = float(row[1] or 0)
        compression[table] = str(row[2] or "-")
    errors = [r for r in results if r != "found"]
    return Phase(
        method=method,
        mail=mail,
        count=args.count,
        found=results.count("found"),
        raw_bytes=raw_bytes,
        stored=stored,
        compression=compression,
        table_growth={t: after[t][0] - before[t][0] for t in TABLES},
        total_growth={t: after[t][1] - before[t][1] for t in TABLES},
        seconds=seconds,
        recipients=recipients,
        error=errors[0][:80] if errors else "",
    )


def server_cost(
    conn: psycopg.Connection[Any], method: str, repeat: int, recipients: list[str]
) -> Cost:
    """Server time per message to store (compress) and to read back
    (decompress, via md5) the newsletters to `recipients` (the same ones for
    every method), `repeat` times each."""
    storage = "EXTERNAL" if method == "none" else "EXTENDED"
    conn.execute("DROP TABLE IF EXISTS bench_storage_cost")
    conn.execute("CREATE UNLOGGED TABLE bench_storage_cost (raw bytea)")
    conn.execute(f"ALTER TABLE bench_storage_cost ALTER COLUMN raw SET STORAGE {storage}")
    if method != "none":
        conn.execute(f"ALTER TABLE bench_storage_cost ALTER COLUMN raw SET COMPRESSION {method}")
    source = "SELECT raw FROM sink_messages WHERE all_recipients && %(r)s"
    row = conn.execute(f"SELECT count(*) FROM ({source}) s", {"r": recipients}).fetchone()
    messages = int(row[0]) * repeat if row else 0
    if not messages:
        return Cost(method, float("nan"), float("nan"), 0)
    inserted = read = float("inf")
    for _ in range(3):  # best of three: the machine is shared
        conn.execute("TRUNCATE bench_storage_cost")
        began = time.perf_counter()
        conn.execute(
            f"INSERT INTO bench_storage_cost SELECT s.raw FROM ({source}) s,"
            f" generate_series(1, {int(repeat)})",
            {"r": recipients},
        )
        inserted = min(inserted, time.perf_counter() - began)
        began = time.perf_counter()
        conn.execute("SELECT count(DISTINCT md5(raw)) FROM bench_storage_cost").fetchone()
        read = min(read, time.perf_counter() - began)
    conn.execute("DROP TABLE bench_storage_cost")
    return Cost(method, inserted / messages * 1e6, read / messages * 1e6, messages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="lifecycles per mail (100)")
    parser.add_argument("--methods", default=",".join(METHODS), help="none,pglz,lz4")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads (4)")
    parser.add_argument("--cost-repeat", type=int, default=20, help="copies per cost run (20)")
    parser.add_argument(
        "--database-url",
        default="",
        help="a PostgreSQL server to run on instead of the embedded one (a database"
        " sbx_storage_PID is created there and dropped after), e.g. one built with lz4",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods or any(m not in METHODS for m in methods) or args.count < 1:
        parser.error("--methods takes none, pglz and lz4; --count must be positive")
    try:
        with _database(args.database_url) as url:
            return _run(args, methods, url)
    except KeyboardInterrupt:
        print("interrupted; the stack was stopped", file=sys.stderr)
        return 130


@contextlib.contextmanager
def _database(server_url: str) -> Iterator[str]:
    """A fresh database on `server_url` for the run ("" for the embedded one)."""
    if not server_url:
        yield ""
        return
    name = f"sbx_storage_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _stack.with_database(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(args: argparse.Namespace, methods: list[str], database_url: str) -> int:
    print("starting signalbox-server up ...", flush=True)
    phases: list[Phase] = []
    costs: list[Cost] = []
    skipped: list[str] = []
    with _stack.running_stack(flower=False, keep=args.keep, database_url=database_url) as stack:
        with psycopg.connect(stack.database_url(), autocommit=True) as conn:
            (offered,) = conn.execute(
                "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
            ).fetchone() or ([],)
            (default,) = conn.execute("SHOW default_toast_compression").fetchone() or ("?",)
            migrated = conn.execute(
                "SELECT string_agg(attrelid::regclass || '.raw ' ||"
                " CASE attcompression WHEN 'l' THEN 'lz4' WHEN 'p' THEN 'pglz'"
                " ELSE 'default' END, ', ' ORDER BY 1)"
                " FROM pg_attribute WHERE attname = 'raw'"
                " AND attrelid IN ('messages'::regclass, 'sink_messages'::regclass)"
            ).fetchone()
            for method in methods:
                if method != "none" and method not in offered:
                    skipped.append(method)  # this server was built without it
                    continue
                set_method(conn, method)
                for mail in _mails.TYPICAL:
                    print(f"{method}: {args.count} x {mail} ...", flush=True)
                    phases.append(run_phase(stack, conn, method, mail, args))
                goal = next(p for p in phases if p.mail == GOAL_MAIL)
                costs.append(server_cost(conn, method, args.cost_repeat, goal.recipients))
        load = _stack.load_average()
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    report(args, phases, costs, str(default), str(migrated[0] if migrated else "?"), load)
    for method in skipped:
        print(f"{method}: not measured, this PostgreSQL is built without it (see --database-url)")
    print("machine")
    print(machine)
    return 0


def _pct(part: float, whole: float) -> str:
    return f"{part / whole * 100:.0f} %" if whole else "n/a"


def report(
    args: argparse.Namespace,
    phases: list[Phase],
    costs: list[Cost],
    default: str,
    migrated: str,
    load: str,
) -> None:
    print()
    print("disk per stored message: one sink_messages row and one messages row per mail")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/storage.py', *sys.argv[1:]])}")
    print(f"  migrated    {migrated} (default_toast_compression = {default})")
    print(f"  load avg    {load} (at the end)")
    print()
    rows = []
    for p in phases:
        sink, msgs = p.stored["sink_messages"], p.stored["messages"]
        per = {t: p.table_growth[t] / p.count for t in TABLES}
        total = sum(p.total_growth.values()) / p.count
        rows.append(
            (
                f"{p.method:<4}  {p.mail}",
                f"{p.found}/{p.count}",
                f"{p.raw_bytes:,.0f}",
                f"{sink:,.0f} ({_pct(sink, p.raw_bytes)})",
                f"{msgs:,.0f} ({_pct(msgs, p.raw_bytes)})",
                p.compression["sink_messages"],
                f"{per['sink_messages']:,.0f}",
                f"{per['messages']:,.0f}",
                f"{total:,.0f} ({_pct(total, 2 * p.raw_bytes)})",
            )
        )
    print(
        _stack.table(
            rows,
            (
                "method  mail",
                "found",
                "raw B",
                "sink raw: stored B",
                "messages raw: stored B",
                "stored as",
                "sink table B/msg",
                "messages table B/msg",
                "both with indexes B/msg (of 2 x raw)",
            ),
        )
    )
    errors = [p for p in phases if p.error]
    for p in errors:
        print(f"  {p.method} {p.mail}: first error {p.error}")
    print()
    print(
        _stack.table(
            [(c.method, f"{c.messages}", f"{c.insert_us:.1f}", f"{c.read_us:.1f}") for c in costs],
            ("server cost, QP newsletter", "messages", "store us/msg", "read (md5) us/msg"),
        )
    )
    print()
    for p in phases:
        if p.mail == GOAL_MAIL:
            worst = max(p.stored.values())
            verdict = "met" if worst <= p.raw_bytes / 2 else "NOT met"
            print(
                f"goal (a ~20 KB HTML mail costs <= half its raw size), {p.method}: each copy"
                f" {worst:,.0f} of {p.raw_bytes:,.0f} bytes ({_pct(worst, p.raw_bytes)}): {verdict}"
            )


if __name__ == "__main__":
    sys.exit(main())
