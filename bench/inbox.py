"""The inbox at scale: a list page and a `to:` + `subject:` search, timed, with
`--count` messages stored (100,000 by default).

On an embedded PostgreSQL of its own, migrated: `--count` recorded messages
(as the sink records them for the inbox: summary, To, subject, the words'
`tsvector`), spread over 1,000 addresses of a domain namespace `default`
owns, one in ten to another namespace's domain. Then, through the use case
the API calls (`app.usecases.inbox.list_messages`, visibility included),
`--rounds` times each: the first page (50, newest first), a page deep in the
list (by its cursor), and `q=to:<one address> subject:<a word>`. Prints
p50 and p99 of each, the plan's indexes, and the machine.

    uv run python bench/inbox.py                 # 100,000 messages
    uv run python bench/inbox.py --count 20000   # quicker

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _machine
from floor import _Postgres

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ADDRESSES = 1000


def fill(url: str, count: int) -> None:
    import psycopg

    domain = "CASE WHEN g %% 10 = 0 THEN '@team-b.test' ELSE '@team-a.test' END"
    address = f"'user-' || (g %% {ADDRESSES}) || {domain}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO messages (id, provider, provider_message_id, received_at, subject,"
            " recipients, delivered_to, to_addrs, cc_addrs, from_addr, header_message_id, size,"
            " attachments, words, raw)"
            f" SELECT 'msg_' || lpad(to_hex(g), 24, '0'), 'sink', g::text,"
            "        now() - make_interval(secs => %s - g),"
            "        'Your order ' || g || ' '"
            "        || (ARRAY['shipped', 'confirmed', 'refunded'])[g %% 3 + 1],"
            f"        ARRAY[{address}], ARRAY[{address}], ARRAY[{address}], '{{}}',"
            "        'shop@brand.test', g || '@brand.test', 2000, (g %% 7 = 0)::int,"
            "        to_tsvector('simple', 'Your order ' || g || ' hello from the shop'),"
            "        'x'::bytea"
            "   FROM generate_series(1, %s) g",
            (count, count),
        )
        conn.execute("VACUUM ANALYZE messages")


def timed(fn: object, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        began = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - began) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="stored messages (100000)")
    parser.add_argument("--rounds", type=int, default=50, help="requests of each kind (50)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="signalbox-inbox-") as tmp:
        pg = _Postgres(Path(tmp))
        try:
            url = pg.database_url()
            os.environ.update(
                SIGNALBOX_DATABASE_URL=url,
                SIGNALBOX_API_TOKENS="default:tok-bench-default-1,other:tok-bench-other-1",
                SIGNALBOX_NAMESPACE_DOMAINS="default:team-a.test,other:team-b.test",
            )
            from app.db.migrate import upgrade
            from app.usecases import inbox
            from app.usecases.auth import Principal
            from app.usecases.inbox import InboxFilter, query_of

            upgrade(url)
            began = time.perf_counter()
            fill(url, args.count)
            filled = time.perf_counter() - began
            caller = Principal(namespace="default")
            plain = InboxFilter(namespace="default")
            search = InboxFilter(
                namespace="default", query=query_of("to:user-7@team-a.test subject:shipped")
            )
            first = inbox.list_messages(caller, plain, limit=50, cursor=None)
            cursor = first.next_cursor
            for _ in range(20):  # 1,000 messages deep
                cursor = inbox.list_messages(caller, plain, limit=50, cursor=cursor).next_cursor
            found = inbox.list_messages(caller, search, limit=50, cursor=None)
            figures = {
                "first page (50)": timed(
                    lambda: inbox.list_messages(caller, plain, limit=50, cursor=None), args.rounds
                ),
                "page 21 (by cursor)": timed(
                    lambda: inbox.list_messages(caller, plain, limit=50, cursor=cursor), args.rounds
                ),
                "to: + subject: search": timed(
                    lambda: inbox.list_messages(caller, search, limit=50, cursor=None), args.rounds
                ),
            }
            machine = _machine.render(_machine.describe(url, None))
        finally:
            from app.db.engine import dispose_engines

            dispose_engines()
            pg.stop()
    print(f"inbox: {args.count} messages stored (filled in {filled:.1f} s), {args.rounds} rounds")
    print(f"  first page items {len(first.items)}, search items {len(found.items)}")
    for name, values in figures.items():
        print(
            f"  {name:<24} p50 {statistics.median(values):7.2f} ms   p99 {p(values, 0.99):7.2f} ms"
        )
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
