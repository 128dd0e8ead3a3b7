"""Soak and chaos: thousands of short-lived signals under faults; nothing may be lost.

Starts its own PostgreSQL and Redis (or uses SIGNALBOX_TEST_DATABASE_URL /
SIGNALBOX_TEST_REDIS_URL), a real MailDev and a real Dovecot (each behind a
delaying proxy), and the Signalbox processes: API, SMTP sink, two workers on
the `signals` queue, one worker on the `dead_letter` queue (its log is the
trace of every dead-letter publication) and beat. Then, from a seeded plan
(bench/soak_plan.py), it creates signals across the providers, namespaces and
runs with short windows and small check budgets, and delivers mail through
each window: early (the same second as `received_after`), anywhere, in the
last two seconds, after the deadline, before the window, other runs' mail to
shared addresses, with and without run markers, next to busy addresses with
hundreds of older messages. Webhook pushes (`POST /v1/inbound/{provider}`)
fire all along. Meanwhile it injects faults:

- kill_worker: SIGKILL to a worker's main process (started again) or to one
  of its pool children;
- restart_broker: Redis stopped (it saves, like a packaged Redis) and started;
- restart_postgres: PostgreSQL stopped (fast) and started;
- stop_provider: MailDev or Dovecot stopped for a while, then started;
- slow_provider: MailDev or Dovecot answering later than a check lease;
- idle_in_transaction: a snapshot held open for minutes (the xmin horizon
  pinned: dead rows pile up in the hot tables), sampled during and after;
- terminate_backends: `pg_terminate_backend` of random backends of the API,
  the sink, the workers and beat, several rounds;
- exhaust_connections: another client holds every free connection for a
  while; readiness and creates are probed meanwhile (503, never 500);
- with --partition, network partitions (bench/soak_netns.py): a worker and
  PostgreSQL, the sink and PostgreSQL, every process and the broker;
- with --overload SECONDS, 1.5 x the create rate the stack sustains, found
  first (bench/soak_overload.py): the oldest-due gauge's peak and the time to
  drain are reported.

After the invariants it prints what each database fault observed and the
recovery time after every fault: from its end to the first create answered
and the first signal found.

At the end it checks the invariants (bench/soak_invariants.py) on the
database and prints the table, the faults and the machine. Exit status 1 if
any invariant is violated.

    uv run python bench/soak.py --signals 3000 --duration 300
    uv run python bench/soak.py --signals 90 --duration 15 --window 12-25 --provider-outage 8
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import imaplib
import json
import math
import random
import shutil
import signal
import smtplib
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._machine import describe, render  # noqa: E402
from bench.soak_invariants import Report, check  # noqa: E402
from bench.soak_netns import PARTITIONS  # noqa: E402
from bench.soak_overload import Overload  # noqa: E402
from bench.soak_pgfaults import PgFaults, recovery, render_faults_observed  # noqa: E402
from bench.soak_plan import Plan, PlannedMail, PlannedSignal, make_plan  # noqa: E402
from bench.soak_scheduler import Scheduler  # noqa: E402
from bench.soak_world import NAMESPACES, PROVIDER_NAMES, Tuning, World, token_of  # noqa: E402
from tests.servers import imap_append  # noqa: E402

FAULTS = (
    "kill_worker",
    "restart_broker",
    "restart_postgres",
    "stop_provider",
    "slow_provider",
    "idle_in_transaction",
    "terminate_backends",
    "exhaust_connections",
)
# With --partition: one worker, the sink and Redis in network namespaces of their
# own; with --overload: 1.5 x the rate the stack sustains, for minutes.
ALL_FAULTS = (*FAULTS, *PARTITIONS, "overload")
CREATE_RETRY_SECONDS = 60.0
DELIVERY_RETRY_SECONDS = 90.0
# A slowed provider answers each round trip this share of the check lease
# late: an IMAP look (select, search, fetch, a few round trips) then takes
# longer than a lease, so only the lease heartbeat keeps it counted.
SLOW_ROUND_TRIP_SHARE = 0.3


@dataclass
class Options:
    signals: int = 300
    duration: float = 60.0
    providers: list[str] = field(default_factory=lambda: ["sink", "maildev", "imap"])
    faults: list[str] = field(default_factory=lambda: list(FAULTS))
    fault_count: int | None = None
    # False: the faults come in the order of `faults` (the CI run puts the long ones last).
    shuffle_faults: bool = True
    seed: int = 1
    window_min: int = 20
    window_max: int = 60
    provider_outage: float = 60.0
    broker_outage: float = 2.0
    postgres_outage: float = 3.0
    slow_for: float = 30.0
    idle_for: float = 60.0
    idle_after: float = 15.0
    terminate_rounds: int = 5
    exhaust_for: float = 60.0
    partition: bool = False
    partition_for: float = 30.0
    overload_for: float = 120.0
    overload_factor: float = 1.5
    overload_step: float = 10.0
    overload_steps: int = 6
    push_interval: float = 2.0
    busy_messages: int = 0
    busy_maildev: int = 0
    grace: float = 20.0
    dlq_drain: float = 20.0
    # Deliveries and creations block a thread each for a round trip; too few
    # threads and the harness, not the product, delivers late (the report's
    # "delivery lag" shows it).
    threads: int = 96
    keep: bool = False
    tuning: Tuning = field(default_factory=Tuning)


@dataclass
class Outcome:
    report: Report
    record: dict[str, Any]
    faults: Counter[str]
    wall: float
    root: Path
    machine: list[tuple[str, str]]

    def render(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        head = [
            "soak: nothing that is there before the deadline is lost",
            f"  date          {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}",
            f"  command       {' '.join(sys.argv) if sys.argv else 'soak'}",
            f"  signals       {len(self.record['signals'])} planned,"
            f" {sum(1 for m in self.record['mails'] if m.get('acked'))} mails delivered",
            f"  faults        {faults}",
            f"  wall time     {self.wall:.1f} s",
            f"  logs          {self.root}",
            "",
        ]
        fault_lines = [
            f"    {f['at']:7.1f} s  {f['kind']:<16} {f['detail']}" for f in self.record["faults"]
        ]
        return "\n".join(
            [
                *head,
                self.report.render(),
                "",
                "  faults injected (seconds after start)",
                *fault_lines,
                *render_faults_observed(self.record),
                "machine",
                render(self.machine),
            ]
        )


class Soak:
    def __init__(self, opts: Options, world: World, plan: Plan, log: Callable[[str], None]):
        self.opts, self.world, self.plan, self.log = opts, world, plan, log
        self.rng = random.Random(plan.seed + 1)
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.signals: dict[str, dict[str, Any]] = {}
        self.mails: dict[str, dict[str, Any]] = {}
        self.faults: list[dict[str, Any]] = []
        self.pushes = 0
        self.stopping = threading.Event()
        self.clock_offset = self._clock_offset()
        self.http = httpx.Client(base_url=world.stack.api_url, timeout=30)
        self.consumer_http = httpx.Client(base_url=world.stack.api_url, timeout=30)
        self.consumes: Counter[str] = Counter()
        self.rng_consume = random.Random(plan.seed + 2)
        self.pg = PgFaults(
            connect=world.postgres.connect,
            dbname=world.postgres.dbname,
            api=httpx.Client(base_url=world.stack.api_url, timeout=10),
            probe_token=token_of(NAMESPACES[-1]),
        )

    # -- clocks ---------------------------------------------------------------------------

    def _clock_offset(self) -> float:
        """The server's clock minus ours (PostgreSQL's clock_timestamp()), midpoint of 5 reads."""
        samples = []
        with self.world.postgres.connect() as conn:
            for _ in range(5):
                before = time.time()
                row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
                after = time.time()
                assert row is not None
                samples.append((after - before, float(row[0]) - (before + after) / 2))
        return min(samples)[1]

    def elapsed(self) -> float:
        return time.time() - self.t0

    # -- mail -------------------------------------------------------------------------------

    def _raw(self, mail: PlannedMail) -> bytes:
        msg = EmailMessage()
        msg["From"] = "app@example.test"
        msg["To"] = mail.recipient
        msg["Subject"] = mail.subject
        # Whole seconds, as every mailer writes it (MailDev takes it as the received time).
        msg["Date"] = formatdate(usegmt=True)
        msg["Message-ID"] = make_msgid(idstring=mail.mail_id, domain="soak.test")
        if mail.run_marker is not None:
            msg["X-Signalbox-Run"] = mail.run_marker
        msg.set_content(f"Your code is {self.rng.randrange(10**6):06d}\nmail {mail.mail_id}\n")
        return bytes(msg)

    def _send_once(self, mail: PlannedMail) -> None:
        raw = self._raw(mail)
        if mail.provider == "sink":
            port, host = self.world.stack.smtp_port, self.world.smtp_host
        elif mail.provider == PROVIDER_NAMES["maildev"]:
            assert self.world.maildev is not None
            port, host = self.world.maildev.smtp_port, "127.0.0.1"
        else:
            assert self.world.dovecot is not None
            imap_append(self.world.dovecot, raw)
            return
        with smtplib.SMTP(host, port, timeout=15) as smtp:
            smtp.sendmail("app@example.test", [mail.recipient], raw)

    def deliver(
        self, mail: PlannedMail, *, before_create: bool = False, planned: float | None = None
    ) -> dict[str, Any]:
        """One delivery attempt now; on failure, another is scheduled 0.5 s later
        (no thread waits on a provider that is down) until it is acknowledged
        or `DELIVERY_RETRY_SECONDS` have passed. `before_create` retries in place."""
        entry: dict[str, Any] = {
            **asdict(mail),
            "planned": planned or time.time(),
            "acked": None,
            "attempts": 0,
            "error": None,
            "sent_before_create": before_create,
        }
        with self.lock:
            self.mails[mail.mail_id] = entry
        self._attempt(mail, entry, in_place=before_create)
        return entry

    def _attempt(self, mail: PlannedMail, entry: dict[str, Any], *, in_place: bool) -> None:
        while True:
            entry["attempts"] += 1
            started = time.time()
            # An attempt that failed may still have been stored (its commit
            # made, its 250 lost): the message's stamp can be this early.
            entry.setdefault("first_sent", started)
            try:
                self._send_once(mail)
            except (OSError, smtplib.SMTPException, imaplib.IMAP4.error, RuntimeError) as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"[:200]
                if time.time() > entry["planned"] + DELIVERY_RETRY_SECONDS or (
                    self.stopping.is_set()
                ):
                    return
                if not in_place:
                    self.scheduler.at(
                        time.time() + 0.5, lambda: self._attempt(mail, entry, in_place=False)
                    )
                    return
                time.sleep(0.5)
                continue
            entry["acked"] = time.time()
            entry["sent"] = started  # the provider stamped it in [sent, acked]
            entry["error"] = None
            return

    # -- signals ----------------------------------------------------------------------------

    def create(self, ps: PlannedSignal) -> None:
        early = [m for m in ps.mails if m.before_created is not None]
        due = self.t0 + ps.create_at
        for m in early:
            entry = self.deliver(m, before_create=True)
            if entry["acked"] is not None:
                # A clear gap: the window opens at least 2 s after this mail.
                due = max(due, entry["acked"] + 2.0)
        if due > time.time() + 0.05:
            self.scheduler.at(due, lambda: self._post_signal(ps))
        else:
            self._post_signal(ps)

    def _post_signal(self, ps: PlannedSignal) -> None:
        payload = {
            "run_id": ps.run_id,
            "test_case": ps.test_case,
            "recipient": ps.recipient,
            "provider": ps.provider,
            "expires_in_seconds": ps.window,
            "max_checks": ps.max_checks,
            "require_run_marker": ps.require_run_marker,
            "metadata": {"soak": ps.key},
        }
        if ps.subject_contains:
            payload["subject_contains"] = ps.subject_contains
        sent_early: set[str] = set()
        if ps.fate == "early":
            # The window opens at an instant we choose, half-way through a
            # second, and the mail comes within that same second: a provider
            # that stamps whole seconds (a Date header, INTERNALDATE) puts it
            # before `received_after`. Scheduled now, not after the answer,
            # so a slow API does not push it into the next second.
            server_now = time.time() + self.clock_offset
            opens = math.floor(server_now + 1.0) + 0.5
            payload["received_after"] = (
                datetime.fromtimestamp(opens, UTC).isoformat(timespec="microseconds")
            ).replace("+00:00", "Z")
            for m in ps.mails:
                if m.kind == "match" and m.after_created is not None:
                    when = opens - self.clock_offset + min(m.after_created, 0.4)
                    self.scheduler.at(when, functools.partial(self._deliver_at, m, when))
                    sent_early.add(m.mail_id)
        entry: dict[str, Any] = {
            **{k: v for k, v in asdict(ps).items() if k != "mails"},
            "signal_id": None,
            "created_wall": time.time(),
            "attempts": 0,
            "error": None,
        }
        with self.lock:
            self.signals[ps.key] = entry
        give_up = time.time() + CREATE_RETRY_SECONDS
        headers = {"Authorization": f"Bearer {token_of(ps.namespace)}"}
        view = None
        while view is None:
            entry["attempts"] += 1
            try:
                answer = self.http.post("/v1/signals", json=payload, headers=headers)
                if answer.status_code in (200, 201, 202):
                    view = answer.json()
                    break
                entry["error"] = f"HTTP {answer.status_code}: {answer.text[:200]}"
                if 400 <= answer.status_code < 500 and answer.status_code != 429:
                    break
            except httpx.HTTPError as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"[:200]
            if time.time() > give_up or self.stopping.is_set():
                break
            time.sleep(0.5)
        if view is None:
            self.log(f"signal {ps.key} not created: {entry['error']}")
            return
        answered = time.time()
        entry["signal_id"] = view["signal_id"]
        entry["answered_wall"] = answered
        expires = datetime.fromisoformat(view["expires_at"].replace("Z", "+00:00"))
        deadline = expires.timestamp() - self.clock_offset
        entry["deadline_wall"] = deadline
        # The window as the server opened it, on our clock.
        opened = (
            datetime.fromisoformat(view["received_after"].replace("Z", "+00:00")).timestamp()
            - self.clock_offset
        )
        entry["opened_wall"] = opened
        for m in ps.mails:
            if m.before_created is not None or m.mail_id in sent_early:
                continue
            if m.after_created is not None:
                # Never before the answer: the mail must be inside the window.
                when = max(answered + 0.05, opened + m.after_created)
            elif m.before_deadline is not None:
                when = deadline - m.before_deadline
            else:
                when = deadline + (m.after_deadline or 0.0)
            self.scheduler.at(when, functools.partial(self._deliver_at, m, when))

    def _deliver_at(self, mail: PlannedMail, planned: float) -> None:
        self.deliver(mail, planned=planned)

    # -- background: pushes and faults ---------------------------------------------------

    def push_loop(self, until: float) -> None:
        """Webhook pushes for the external providers, every namespace, all along."""
        external = [PROVIDER_NAMES[p] for p in self.opts.providers if p != "sink"]
        if not external or self.opts.push_interval <= 0:
            return
        while not self.stopping.is_set() and time.time() < until:
            for ns in NAMESPACES:
                for provider in external:
                    with contextlib.suppress(httpx.HTTPError):
                        self.http.post(
                            f"/v1/inbound/{provider}",
                            headers={"Authorization": f"Bearer {token_of(ns)}"},
                        )
                        self.pushes += 1
            self.stopping.wait(self.opts.push_interval)

    def consume_loop(self, until: float) -> None:
        """A consumer: claims what is found and consumes it, as a test would.
        Two of them run side by side over the same signals, so claims race."""
        while not self.stopping.is_set() and time.time() < until:
            with self.lock:
                keys = {s["signal_id"]: s for s in self.signals.values() if s.get("signal_id")}
            try:
                with self.world.postgres.connect() as conn:
                    found = [
                        r[0]
                        for r in conn.execute(
                            "SELECT id FROM signals WHERE status = 'found' AND id = ANY(%s)",
                            (list(keys),),
                        ).fetchall()
                    ]
            except Exception:  # the database may be down (a fault): try again
                found = []
            self.rng_consume.shuffle(found)
            for signal_id in found:
                s = keys[signal_id]
                headers = {"Authorization": f"Bearer {token_of(s['namespace'])}"}
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    claim = self.consumer_http.post(
                        f"/v1/signals/{signal_id}/claim",
                        json={"run_id": s["run_id"], "lease_seconds": 30},
                        headers=headers,
                    )
                    self.consumes[f"claim {claim.status_code}"] += 1
                    if claim.status_code != 200:
                        continue
                    done = self.consumer_http.post(
                        f"/v1/claims/{claim.json()['claim_id']}/consume", headers=headers
                    )
                    self.consumes[f"consume {done.status_code}"] += 1
            self.stopping.wait(0.5)

    def fault_loop(self, times: list[float], kinds: list[str], last_start: float) -> None:
        for at, kind in zip(times, kinds, strict=True):
            wait = self.t0 + at - time.time()
            if wait > 0 and self.stopping.wait(wait):
                return
            if self.elapsed() > last_start:
                # Faults run one after another; when they fell behind, the
                # ones left would hit only signals already ended.
                self.faults.append(
                    {"kind": kind, "at": self.elapsed(), "ended": None, "detail": "skipped: late"}
                )
                continue
            started = self.elapsed()
            self.log(f"fault {kind} ...")
            try:
                detail = self._fault(kind)
            except Exception as exc:  # a fault that failed is recorded, the soak goes on
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                detail = f"FAILED: {type(exc).__name__}: {first_line}"
            self.faults.append(
                {"kind": kind, "at": started, "ended": self.elapsed(), "detail": detail}
            )
            self.log(f"fault {kind}: {detail}")

    def _fault(self, kind: str) -> str:
        o, w = self.opts, self.world
        if kind == "kill_worker":
            return w.kill_worker(self.rng)
        if kind == "restart_broker":
            return w.restart_broker(o.broker_outage)
        if kind == "restart_postgres":
            return w.restart_postgres(o.postgres_outage)
        if kind == "stop_provider":
            return w.stop_provider(self.rng, o.provider_outage)
        if kind == "slow_provider":
            # Per round trip (see SLOW_ROUND_TRIP_SHARE): a look outlives its lease.
            return w.slow_provider(
                self.rng, o.tuning.check_lease * SLOW_ROUND_TRIP_SHARE, o.slow_for
            )
        if kind == "idle_in_transaction":
            return self.pg.idle_in_transaction(o.idle_for, after=o.idle_after)
        if kind == "terminate_backends":
            return self.pg.terminate_backends(self.rng, rounds=o.terminate_rounds)
        if kind == "exhaust_connections":
            return self.pg.exhaust_connections(o.exhaust_for)
        if kind in PARTITIONS:
            return w.partition(kind, o.partition_for)
        if kind == "overload":
            observed = Overload(
                self,
                step_seconds=o.overload_step,
                max_steps=o.overload_steps,
                factor=o.overload_factor,
            ).run(o.overload_for, self.stopping.is_set)
            self.pg.observations.append(observed)
            return (
                f"{observed['overload_per_second']:.1f} creates/s ({o.overload_factor:g} x the"
                f" {observed['sustained_per_second']:.1f}/s sustained) for {o.overload_for:.0f} s;"
                f" oldest due peaked at {observed['oldest_due_peak']} s, drained in"
                f" {observed['time_to_drain']} s"
            )
        raise ValueError(f"unknown fault {kind}")

    # -- the run ------------------------------------------------------------------------------

    def preload_busy(self) -> None:
        """Hundreds of older messages to the busy addresses, before any signal exists.

        MailDev gets them over SMTP. The sink's are written straight into its
        store (`sink_messages`, what the sink itself writes): hundreds of SMTP
        round trips through the sink take most of a minute on a busy machine
        and would test nothing more, since no signal waits for them yet.
        """
        if not self.plan.busy_mail:
            return
        by_provider: dict[str, list[PlannedMail]] = {}
        for m in self.plan.busy_mail:
            by_provider.setdefault(m.provider, []).append(m)
        for provider, mails in by_provider.items():
            if provider == "sink":
                with self.world.postgres.connect() as conn, conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO sink_messages (mail_from, envelope_recipients,"
                        " all_recipients, size, raw) VALUES (%s, %s, %s, %s, %s)",
                        [
                            (
                                "app@example.test",
                                [m.recipient],
                                [m.recipient],
                                len(raw),
                                raw,
                            )
                            for m in mails
                            for raw in [self._raw(m)]
                        ],
                    )
            else:
                assert self.world.maildev is not None
                with smtplib.SMTP("127.0.0.1", self.world.maildev.smtp_port, timeout=30) as smtp:
                    for m in mails:
                        smtp.sendmail("app@example.test", [m.recipient], self._raw(m))
            now = time.time()
            for m in mails:
                self.mails[m.mail_id] = {
                    **asdict(m),
                    "acked": now,
                    "sent": now,
                    "attempts": 1,
                    "error": None,
                    "sent_before_create": True,
                }
            self.log(f"busy address on {provider}: {len(mails)} older messages delivered")

    def run(self) -> dict[str, Any]:
        o = self.opts
        self.preload_busy()
        self.t0 = time.time()
        self.scheduler = Scheduler(o.threads)
        for ps in self.plan.signals:
            lead = 3.5 if any(m.before_created is not None for m in ps.mails) else 0.0
            self.scheduler.at(
                self.t0 + max(0.0, ps.create_at - lead), functools.partial(self.create, ps)
            )
        last_deadline = o.duration + o.window_max + 2
        threads = [
            threading.Thread(target=self.push_loop, args=(self.t0 + last_deadline,), daemon=True)
        ]
        consumers = [
            threading.Thread(
                target=self.consume_loop, args=(self.t0 + last_deadline + o.grace,), daemon=True
            )
            for _ in range(2)
        ]
        for t in consumers:
            t.start()
        kinds = [k for k in o.faults if k]
        if kinds:
            count = (
                o.fault_count
                if o.fault_count is not None
                else len(kinds) * max(1, int(o.duration // 60))
            )
            span_end = max(8.0, o.duration + o.window_min * 0.5)
            times = [5.0 + (span_end - 5.0) * (i + 0.5) / count for i in range(count)]
            order = [kinds[i % len(kinds)] for i in range(count)]
            if o.shuffle_faults:
                # Its own generator: `self.rng` also draws the mails' codes,
                # on threads already sending, so the order would change from
                # run to run under one seed.
                random.Random(self.plan.seed + 3).shuffle(order)
            threads.append(
                threading.Thread(
                    target=self.fault_loop,
                    args=(times, order, o.duration + o.window_max - 5.0),
                    daemon=True,
                )
            )
        for t in threads:
            t.start()
        # Everything planned is done (late mail included), then the deadlines pass.
        self.scheduler.wait_idle(o.duration + o.window_max + DELIVERY_RETRY_SECONDS + 120)
        for t in threads[1:]:
            t.join(o.provider_outage + o.slow_for + 120)
        deadlines = [s.get("deadline_wall") or 0.0 for s in self.signals.values()]
        settle = max(deadlines, default=time.time()) + o.grace
        self.log(
            f"all mail delivered; waiting {max(0.0, settle - time.time()):.0f} s for deadlines"
        )
        while time.time() < settle:
            time.sleep(0.5)
        self.stopping.set()
        threads[0].join(30)
        for t in consumers:
            t.join(30)
        self.scheduler.close()
        return self.record()

    def record(self) -> dict[str, Any]:
        return {
            "seed": self.plan.seed,
            "grace": self.opts.grace,
            "clock_offset": self.clock_offset,
            "breaker_open": self.opts.tuning.breaker_open,
            "started": self.t0,
            "signals": list(self.signals.values())
            + [
                {**{k: v for k, v in asdict(ps).items() if k != "mails"}, "signal_id": None}
                for ps in self.plan.signals
                if ps.key not in self.signals
            ],
            "mails": list(self.mails.values()),
            "faults": self.faults,
            "outages": [asdict(x) for x in self.world.outages],
            "pushes": self.pushes,
            "observations": self.pg.observations,
            "consumes": dict(self.consumes),
            "harness_errors": self.scheduler.errors,
            "crashes": [
                {"at": at - self.t0, "process": name, "code": code}
                for at, name, code in self.world.crashes
            ],
        }


def wait_dead_letters(world: World, timeout: float) -> dict[str, int]:
    """Until the dead-letter consumer has handled every dead letter (or `timeout`)."""
    end = time.time() + timeout
    while True:
        alerts = world.dead_letter_alerts()
        with world.postgres.connect() as conn:
            ids = {r[0] for r in conn.execute("SELECT id FROM dead_letters").fetchall()}
        if ids <= set(alerts) or time.time() > end:
            return alerts
        time.sleep(1.0)


def run_soak(
    opts: Options, root: Path | None = None, log: Callable[[str], None] | None = None
) -> Outcome:
    """Build the world, run the plan under faults, check the invariants; stop everything."""
    began = time.time()
    root = root or Path(tempfile.mkdtemp(prefix="sbx-soak-"))
    root.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        line = f"[{time.time() - began:7.1f}s] {text}"
        (log or (lambda s: print(s, file=sys.stderr, flush=True)))(line)

    plan = make_plan(
        signals=opts.signals,
        duration=opts.duration,
        providers=opts.providers,
        seed=opts.seed,
        window_min=opts.window_min,
        window_max=opts.window_max,
        base=opts.tuning.backoff_base,
        cap=opts.tuning.backoff_cap,
        coalesce=opts.tuning.coalesce,
        busy_messages=opts.busy_messages,
        busy_maildev=opts.busy_maildev,
    )
    say(f"plan: {len(plan.signals)} signals, seed {opts.seed}; starting the world in {root}")
    partitions = opts.partition or any(f in PARTITIONS for f in opts.faults)
    world = World.start(root, opts.providers, opts.tuning, log=say, partitions=partitions)
    try:
        say("world up: PostgreSQL, Redis, providers, api, smtp, 2 workers, dlq worker, beat")
        world.supervise()
        soak = Soak(opts, world, plan, say)
        try:
            record = soak.run()
        finally:
            soak.http.close()
            soak.pg.api.close()
            soak.consumer_http.close()
        alerts = wait_dead_letters(world, opts.dlq_drain)
        record["alerts"] = alerts
        with world.postgres.connect() as conn:
            report = check(conn, record, alerts)
            record["recovery"] = recovery(conn, record)
        machine = describe(world.postgres.url, world.broker.url)
        (root / "soak-record.json").write_text(json.dumps(record, default=str, indent=1))
        if record["harness_errors"]:
            say(f"harness errors: {record['harness_errors'][:5]}")
        return Outcome(
            report=report,
            record=record,
            faults=Counter(f["kind"] for f in record["faults"] if f["ended"] is not None),
            wall=time.time() - began,
            root=root,
            machine=machine,
        )
    finally:
        if opts.keep:
            with contextlib.suppress(Exception):
                dump_tables(world, root / "db")
        world.close()
        if not opts.keep and root.name.startswith("sbx-soak-"):
            # Logs and the record stay with --keep; the databases go either way.
            shutil.rmtree(root / "maildev", ignore_errors=True)


def dump_tables(world: World, into: Path) -> None:
    """--keep: the tables an investigation reads, as CSV (the database goes)."""
    into.mkdir(parents=True, exist_ok=True)
    queries = {
        "signals": "SELECT * FROM signals",
        "checks": "SELECT * FROM checks",
        "near_misses": "SELECT * FROM near_misses",
        "messages": "SELECT id, provider, provider_message_id, received_at, observed_at,"
        " subject, recipients, run_marker FROM messages",
    }
    with world.postgres.connect() as conn, conn.cursor() as cur:
        for name, sql in queries.items():
            with (
                (into / f"{name}.csv").open("wb") as out,
                cur.copy(f"COPY ({sql}) TO STDOUT WITH CSV HEADER") as copy,
            ):
                for chunk in copy:
                    out.write(chunk)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=300)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of signal creation")
    parser.add_argument("--providers", default="sink,maildev,imap")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma list, or empty")
    parser.add_argument(
        "--fault-count", type=int, help="faults in all (default: each kind per minute)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--window", default="20-60", help="signal windows, seconds MIN-MAX")
    parser.add_argument("--provider-outage", type=float, default=60.0)
    parser.add_argument("--slow-for", type=float, default=30.0)
    parser.add_argument("--idle-for", type=float, default=60.0, help="idle_in_transaction: s")
    parser.add_argument("--idle-after", type=float, default=15.0, help="dead rows read again after")
    parser.add_argument("--terminate-rounds", type=int, default=5)
    parser.add_argument("--exhaust-for", type=float, default=60.0, help="exhaust_connections: s")
    parser.add_argument(
        "--partition",
        action="store_true",
        help="also partition a worker, the sink and the broker (network namespaces; root)",
    )
    parser.add_argument("--partition-for", type=float, default=30.0, help="seconds each")
    parser.add_argument(
        "--overload",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also overload the stack at --overload-factor x its sustained rate for SECONDS"
        " (found first)",
    )
    parser.add_argument(
        "--overload-factor",
        type=float,
        default=1.5,
        help="the overload's rate as a multiple of the sustained one (default 1.5)",
    )
    parser.add_argument("--push-interval", type=float, default=2.0)
    parser.add_argument(
        "--busy-messages", type=int, default=600, help="older messages to the sink's busy address"
    )
    parser.add_argument(
        "--busy-maildev", type=int, default=300, help="older messages to MailDev's busy address"
    )
    parser.add_argument("--grace", type=float, default=20.0)
    parser.add_argument("--check-lease", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=96, help="harness threads")
    parser.add_argument("--keep", action="store_true")
    a = parser.parse_args(argv)
    wmin, _, wmax = a.window.partition("-")
    providers = [p for p in a.providers.split(",") if p]
    for p in providers:
        if p not in PROVIDER_NAMES:
            parser.error(f"unknown provider {p!r} (sink, maildev, imap)")
    faults = [f for f in a.faults.split(",") if f]
    if a.partition:
        faults += [p for p in PARTITIONS if p not in faults]
    if a.overload > 0 and "overload" not in faults:
        faults.append("overload")
    for f in faults:
        if f not in ALL_FAULTS:
            parser.error(f"unknown fault {f!r} ({', '.join(ALL_FAULTS)})")
    return Options(
        signals=a.signals,
        duration=a.duration,
        providers=providers,
        faults=faults,
        fault_count=a.fault_count,
        seed=a.seed,
        window_min=int(wmin),
        window_max=int(wmax or wmin),
        provider_outage=a.provider_outage,
        slow_for=a.slow_for,
        idle_for=a.idle_for,
        idle_after=a.idle_after,
        terminate_rounds=a.terminate_rounds,
        exhaust_for=a.exhaust_for,
        partition=a.partition,
        partition_for=a.partition_for,
        overload_for=a.overload or 120.0,
        overload_factor=a.overload_factor,
        push_interval=a.push_interval,
        busy_messages=a.busy_messages,
        busy_maildev=a.busy_maildev,
        grace=a.grace,
        keep=a.keep,
        threads=a.threads,
        tuning=Tuning(check_lease=a.check_lease),
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the world (servers, workers) is stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    outcome = run_soak(opts)
    print(outcome.render())
    return 1 if outcome.report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
