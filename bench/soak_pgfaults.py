"""The faults PostgreSQL queues are judged by, done to the soak's database.

Each fault is a bounded event against the soak's own database (never a shared
server's other databases) and returns a one-line detail for the fault table;
what it observed while it lasted (dead rows, refused requests) goes into
`observations`, which the soak prints beside its invariants.

- idle_in_transaction: a client opens a REPEATABLE READ transaction, reads the
  hot tables, and sits for `seconds`: the xmin horizon is pinned, so every
  update and delete of the soak leaves dead rows VACUUM may not remove. The
  hot tables' dead rows and the oldest transaction's age are sampled during
  and after.
- terminate_backends: `pg_terminate_backend` of a random share of the
  Signalbox processes' backends (found by their `application_name`, which the
  soak gives each process), several rounds apart.
- exhaust_connections: another client takes every connection the server has
  left for `seconds`; meanwhile `/readyz` and a create are probed: readiness
  must say 503, a create must answer 201/429/503 (503 with Retry-After), never
  500. The probe's creates ask for a mailbox of a namespace of their own, so
  none is left waiting for the invariants.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg

# The tables a lifecycle updates: where a pinned horizon shows first.
HOT_TABLES = ("signals", "checks", "claims", "messages", "sink_messages", "dead_letters")
# The soak names each Signalbox process's connections `<prefix><process>`.
APP_PREFIX = "sbx-soak-"


@dataclass
class Sample:
    at: float
    dead_rows: int
    oldest_xact: float


@dataclass
class PgFaults:
    """Faults on the soak's database; `connect()` opens an autocommit psycopg
    connection to it, `admin` one to the server (for the other database's view)."""

    connect: Callable[[], psycopg.Connection[Any]]
    dbname: str
    api: httpx.Client
    probe_token: str
    observations: list[dict[str, Any]] = field(default_factory=list)

    # -- what the database looks like -------------------------------------------------

    def sample(self) -> Sample:
        with self.connect() as conn:
            dead = conn.execute(
                "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
                " WHERE relname = ANY(%s)",
                (list(HOT_TABLES),),
            ).fetchone()
            oldest = conn.execute(
                "SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)"
                " FROM pg_stat_activity WHERE datname = %s AND xact_start IS NOT NULL"
                " AND pid <> pg_backend_pid()",
                (self.dbname,),
            ).fetchone()
        return Sample(time.time(), int(dead[0] if dead else 0), float(oldest[0] if oldest else 0))

    def _sampling(self, every: float, stop: threading.Event) -> list[Sample]:
        samples: list[Sample] = []

        def loop() -> None:
            while not stop.is_set():
                with contextlib.suppress(psycopg.Error):
                    samples.append(self.sample())
                stop.wait(every)

        threading.Thread(target=loop, name="soak-pg-sampler", daemon=True).start()
        return samples

    # -- idle in transaction ------------------------------------------------------------

    def idle_in_transaction(self, seconds: float, after: float = 15.0) -> str:
        """Hold a snapshot open for `seconds`; dead rows before, at the end, and `after` later."""
        before = self.sample()
        with self.connect() as conn:
            conn.autocommit = False
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.execute("SELECT count(*) FROM signals").fetchone()
            stop = threading.Event()
            samples = self._sampling(5.0, stop)
            time.sleep(seconds)
            stop.set()
            held = self.sample()
            conn.rollback()
        time.sleep(after)
        released = self.sample()
        peak_age = max(s.oldest_xact for s in [*samples, held])
        self.observations.append(
            {
                "fault": "idle_in_transaction",
                "held_seconds": seconds,
                "dead_rows_before": before.dead_rows,
                "dead_rows_at_release": held.dead_rows,
                "dead_rows_after": released.dead_rows,
                "oldest_transaction_peak": round(peak_age, 1),
            }
        )
        return (
            f"a REPEATABLE READ snapshot held {seconds:.0f} s (oldest transaction"
            f" {peak_age:.0f} s); hot tables' dead rows {before.dead_rows} before,"
            f" {held.dead_rows} at release, {released.dead_rows} {after:.0f} s later"
        )

    # -- pg_terminate_backend -------------------------------------------------------------

    def app_backends(self) -> list[tuple[int, str]]:
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pid, application_name FROM pg_stat_activity"
                " WHERE datname = %s AND application_name LIKE %s AND pid <> pg_backend_pid()",
                (self.dbname, APP_PREFIX + "%"),
            ).fetchall()
        return [(int(pid), str(name)[len(APP_PREFIX) :]) for pid, name in rows]

    def terminate_backends(
        self, rng: random.Random, rounds: int = 5, share: float = 0.5, interval: float = 2.0
    ) -> str:
        """`rounds` times, terminate a random `share` of the Signalbox backends."""
        killed: Counter[str] = Counter()
        for i in range(rounds):
            backends = self.app_backends()
            victims = rng.sample(backends, max(1, int(len(backends) * share))) if backends else []
            with self.connect() as conn:
                for pid, process in victims:
                    row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
                    if row and row[0]:
                        killed[process.split("-")[0]] += 1
            if i + 1 < rounds:
                time.sleep(interval)
        self.observations.append({"fault": "terminate_backends", "terminated": dict(killed)})
        by = ", ".join(f"{k} {v}" for k, v in sorted(killed.items())) or "none found"
        return f"pg_terminate_backend of {sum(killed.values())} backends in {rounds} rounds ({by})"

    # -- connections exhausted ----------------------------------------------------------------

    @contextlib.contextmanager
    def _hog(self) -> Iterator[int]:
        """Every connection the server will still give (as the soak's role)."""
        held: list[psycopg.Connection[Any]] = []
        try:
            while True:
                try:
                    held.append(self.connect())
                except psycopg.OperationalError:
                    break
                if len(held) > 2000:
                    break
            yield len(held)
        finally:
            for conn in held:
                with contextlib.suppress(Exception):
                    conn.close()

    def exhaust_connections(self, seconds: float) -> str:
        """Hold every free connection for `seconds`, probing readiness and creates."""
        ready: Counter[int] = Counter()
        creates: Counter[str] = Counter()
        with self._hog() as taken:
            end = time.time() + seconds
            n = 0
            while time.time() < end:
                n += 1
                with contextlib.suppress(httpx.HTTPError):
                    ready[self.api.get("/readyz").status_code] += 1
                try:
                    answer = self.api.post(
                        "/v1/signals",
                        json={
                            "run_id": f"exhaust-{int(time.time())}-{n}",
                            "test_case": "exhaust-probe",
                            "recipient": f"probe-{n}@exhaust.test",
                            "provider": "sink",
                            "expires_in_seconds": 5,
                        },
                        headers={"Authorization": f"Bearer {self.probe_token}"},
                    )
                    code = answer.status_code
                    retry = "Retry-After" in answer.headers
                    creates[f"{code}{'+Retry-After' if code == 503 and retry else ''}"] += 1
                except httpx.HTTPError as exc:
                    creates[type(exc).__name__] += 1
                time.sleep(0.5)
        self.observations.append(
            {
                "fault": "exhaust_connections",
                "connections_taken": taken,
                "readyz": dict(ready),
                "creates": dict(creates),
            }
        )
        return (
            f"{taken} connections held {seconds:.0f} s; /readyz {dict(sorted(ready.items()))},"
            f" creates {dict(sorted(creates.items()))}"
        )


# -- recovery ---------------------------------------------------------------------------------


def recovery(conn: psycopg.Connection[Any], record: dict[str, Any]) -> list[dict[str, Any]]:
    """After each fault that ran: seconds from its end to the first create the API
    answered and to the first signal found (None when nothing came after it)."""
    offset = float(record["clock_offset"])  # server clock - harness clock
    t0 = float(record["started"])
    answered = sorted(
        float(s["answered_wall"]) for s in record["signals"] if s.get("answered_wall")
    )
    found = sorted(
        float(r[0]) - offset
        for r in conn.execute(
            "SELECT extract(epoch FROM found_at) FROM signals WHERE found_at IS NOT NULL"
        ).fetchall()
    )
    rows = []
    for fault in record["faults"]:
        if fault.get("ended") is None:
            continue
        ended = t0 + float(fault["ended"])
        rows.append(
            {
                "kind": fault["kind"],
                "at": fault["at"],
                "ended": fault["ended"],
                "first_create": _first_after(answered, ended),
                "first_found": _first_after(found, ended),
            }
        )
    return rows


def _first_after(instants: list[float], after: float) -> float | None:
    later = [t - after for t in instants if t >= after]
    return round(min(later), 2) if later else None


def render_faults_observed(record: dict[str, Any]) -> list[str]:
    """The database faults' observations and every fault's recovery, as table lines."""
    lines = ["  recovery after each fault (seconds from its end)"]
    lines.append(f"    {'fault':<20} {'ended at':>9} {'first create':>13} {'first found':>12}")
    for r in record.get("recovery", []):
        create = "-" if r["first_create"] is None else f"{r['first_create']:.2f}"
        found = "-" if r["first_found"] is None else f"{r['first_found']:.2f}"
        lines.append(f"    {r['kind']:<20} {r['ended']:>8.1f}s {create:>13} {found:>12}")
    observed = record.get("observations", [])
    if observed:
        lines.append("  what the database faults observed")
        for o in observed:
            rest = ", ".join(f"{k} {v}" for k, v in o.items() if k != "fault")
            lines.append(f"    {o['fault']:<20} {rest}")
    return lines
