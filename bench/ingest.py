"""SMTP ingest: the Signalbox sink against MailDev on this machine, same run.

    uv run python bench/ingest.py [--duration 30] [--connections 1,8]
    uv run python bench/ingest.py --duration 5                 # quick
    uv run python bench/ingest.py --smtp-processes 1           # one sink process

Starts `signalbox-server up` (embedded PostgreSQL and Redis) and a MailDev
(from scripts/install-test-deps.sh) on free loopback ports. For each
connection count, each target (sink, then MailDev) receives for `--duration`
seconds from that many client threads, each holding ONE SMTP connection and
sending one ~1 KiB message after another on it (MAIL FROM, RCPT TO, DATA;
no new connection per message). A message counts when the server answered
`250` to its DATA. No signal waits, so the sink's push finds nothing to do.
With `--bare`, two more targets in each round, from `bench/floor.py`: a bare
aiosmtpd on uvloop that answers `250` and keeps nothing (no store, no
commit): what any sink built on aiosmtpd, durable or not, cannot go above
with these clients; and its durable floor, the same aiosmtpd answering `250`
once a committed INSERT holds the message in the stack's PostgreSQL (the
messages that arrive during one commit go in the next: group commit), and
nothing else: what a sink that keeps the `250` contract cannot go above.

Prints messages/s per target and connection count, the ratio sink / MailDev,
the CPU of the stack's processes while the sink received, and the durability
check: after the run, the rows in `sink_messages` must equal the messages the
sink acknowledged (every `250` was a committed row).

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import contextlib
import email.policy
import smtplib
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _machine
import _stack
from _stack import HOST, KINDS

SMTP_TIMEOUT_SECONDS = 60


def _recipient(i: int, run_id: str) -> str:
    return f"user+{run_id}-{i}@example.test"


def _message(i: int, run_id: str) -> bytes:
    """About 1.2 KB, To: the envelope recipient, as an application sends it
    (a To naming another address would cost the sink a parse for it)."""
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = _recipient(i, run_id)
    msg["Subject"] = f"Verify your address ({uuid.uuid4().hex[:12]})"
    msg["X-Signalbox-Run"] = run_id
    msg["Message-ID"] = f"<{uuid.uuid4().hex}@example.test>"
    body = (
        "Hello,\n\nYour code is 482913. Or follow https://example.test/verify?t="
        + uuid.uuid4().hex
        + "\n\n"
        + "This is filler text so the message is about one kibibyte long.\n" * 12
    )
    msg.set_content(body)
    return msg.as_bytes(policy=email.policy.SMTP)  # CRLF line ends, as on the wire


@dataclass
class Phase:
    target: str
    connections: int
    acknowledged: int
    refused: int
    seconds: float
    error: str = ""

    @property
    def rate(self) -> float:
        return self.acknowledged / self.seconds if self.seconds else 0.0


def send_for(port: int, connections: int, seconds: float, target: str) -> Phase:
    """`connections` threads, one SMTP connection each, sending until time is up."""
    run_id = f"ingest-{uuid.uuid4().hex[:8]}"
    payloads = [(_recipient(i, run_id), _message(i, run_id)) for i in range(64)]
    counts = [0] * connections
    refused = [0] * connections
    errors: list[str] = []
    start = threading.Barrier(connections + 1)
    stop_at = [0.0]

    def sender(k: int) -> None:
        try:
            smtp = smtplib.SMTP(HOST, port, timeout=SMTP_TIMEOUT_SECONDS)
            smtp.ehlo()
        except (OSError, smtplib.SMTPException) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            start.wait()
            return
        start.wait()
        i = 0
        try:
            while time.perf_counter() < stop_at[0]:
                to, raw = payloads[i % len(payloads)]
                try:
                    smtp.sendmail("app@example.test", [to], raw)
                    counts[k] += 1  # sendmail returns after `250` to DATA
                except smtplib.SMTPResponseException:
                    refused[k] += 1
                i += 1
        except (OSError, smtplib.SMTPException) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                smtp.close()

    threads = [threading.Thread(target=sender, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    # Every sender is connected: the clock starts (set before the barrier
    # lets them go, so none reads a stale stop time).
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    return Phase(
        target, connections, sum(counts), sum(refused), elapsed, errors[0] if errors else ""
    )


def sink_rows(stack: _stack.UpStack) -> int:
    import psycopg

    with psycopg.connect(stack.database_url(), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM sink_messages").fetchone()
    return int(row[0]) if row else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per phase (30)")
    parser.add_argument("--connections", default="1,8", help="connection counts (1,8)")
    parser.add_argument("--warmup", type=int, default=20, help="messages before measuring (20)")
    parser.add_argument("--no-flower", action="store_true", help="run the stack without Flower")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    parser.add_argument(
        "--smtp-processes",
        type=int,
        default=0,
        help="sink processes (SIGNALBOX_SMTP_PROCESSES; default: that variable, else the cores)",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="also bench/floor.py's bare aiosmtpd (stores nothing) and its durable floor",
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.connections.split(",") if c.strip()]
    if not counts or min(counts) < 1 or args.duration <= 0:
        parser.error("--connections must be positive integers and --duration positive")
    if args.smtp_processes < 0:
        parser.error("--smtp-processes must be positive")
    args.smtp_processes = args.smtp_processes or _stack.smtp_processes()
    try:
        return _run(args, counts)
    except KeyboardInterrupt:
        print("interrupted; the stack was stopped", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, counts: list[int]) -> int:
    from tests.servers import maildev_server

    phases: list[Phase] = []
    cpu_by_phase: dict[int, dict[str, float]] = {}
    sink_acked = 0
    print("starting signalbox-server up and MailDev ...", flush=True)
    with (
        _stack.running_stack(
            flower=not args.no_flower,
            keep=args.keep,
            env_extra={"SIGNALBOX_SMTP_PROCESSES": str(args.smtp_processes)},
        ) as stack,
        maildev_server(stack.data_dir / "maildev") as maildev,
        _bare_sinks(args.bare, stack, args.smtp_processes) as bare_ports,
    ):
        targets = [("sink", stack.smtp_port), ("maildev", maildev.smtp_port), *bare_ports]
        for target, port in targets:
            # On as many connections as the sink has processes (and then
            # some): the kernel spreads them, so each process gets warmed.
            warm = _warm(port, args.warmup, 2 * args.smtp_processes)
            if target == "sink":
                sink_acked += warm
        for n in counts:
            for target, port in targets:
                print(f"{target}: {n} connection(s) for {args.duration:.0f} s ...", flush=True)
                before = stack.processes.cpu_seconds()
                phase = send_for(port, n, args.duration, target)
                after = stack.processes.cpu_seconds()
                if target == "sink":
                    sink_acked += phase.acknowledged
                    cpu_by_phase[n] = _stack.cpu_delta(before, after)
                phases.append(phase)
                print(f"  {phase.acknowledged} acknowledged, {phase.rate:.0f} msg/s", flush=True)
        time.sleep(1)
        stored = sink_rows(stack)
        load = _stack.load_average()
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    report(args, counts, phases, cpu_by_phase, sink_acked, stored, load, machine)
    return 0


@contextlib.contextmanager
def _bare_sinks(
    wanted: bool, stack: _stack.UpStack, processes: int
) -> Iterator[list[tuple[str, int]]]:
    """bench/floor.py's bare aiosmtpd ("bare": keeps nothing) and its durable
    floor ("durable": one committed INSERT per message into the stack's
    PostgreSQL, commits grouped), each in as many processes as the sink
    has, sharing one port (SO_REUSEPORT); or nothing."""
    if not wanted:
        yield []
        return
    import floor

    ports = {"bare": _stack.free_port(), "durable": _stack.free_port()}
    procs = []
    for _ in range(processes):  # as many as the sink has, on one port each
        procs.append(floor._spawn("--serve-smtp", ports["bare"]))
        procs.append(floor._spawn("--serve-smtp-durable", ports["durable"], stack.database_url()))
    try:
        for port in ports.values():
            floor._wait_port(port)
        yield list(ports.items())
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def _warm(port: int, messages: int, connections: int) -> int:
    """`messages` on each of `connections` connections, one after the other:
    imports, pools and first parses, not measured."""
    sent = 0
    for _ in range(connections if messages >= 1 else 0):
        with smtplib.SMTP(HOST, port, timeout=SMTP_TIMEOUT_SECONDS) as smtp:
            for i in range(messages):
                smtp.sendmail("app@example.test", [_recipient(i, "warm")], _message(i, "warm"))
                sent += 1
    return sent


def report(
    args: argparse.Namespace,
    counts: list[int],
    phases: list[Phase],
    cpu_by_phase: dict[int, dict[str, float]],
    sink_acked: int,
    stored: int,
    load: str,
    machine: str,
) -> None:
    by = {(p.target, p.connections): p for p in phases}
    print()
    print("SMTP ingest: messages answered `250` per second, one connection per sender thread")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/ingest.py', *sys.argv[1:]])}")
    print(f"  message     ~{len(_message(0, 'ingest-00000000'))} bytes")
    print(f"  sink        {args.smtp_processes} process(es) (SIGNALBOX_SMTP_PROCESSES)")
    print(f"  load avg    {load} (at the end)")
    print()
    rows = []
    for n in counts:
        sink, md = by[("sink", n)], by[("maildev", n)]
        floors = [by[(name, n)] for name in ("bare", "durable") if (name, n) in by]
        rows.append(
            (
                f"{n} connection(s)",
                f"{sink.rate:.0f}",
                f"{md.rate:.0f}",
                f"{sink.rate / md.rate:.2f} x" if md.rate else "n/a",
                *(
                    cell
                    for floor in floors
                    for cell in (
                        f"{floor.rate:.0f}",
                        f"{floor.rate / md.rate:.2f} x" if md.rate else "n/a",
                    )
                ),
                f"{sink.refused}/{md.refused}",
                (sink.error or md.error or next((f.error for f in floors if f.error), ""))[:60],
            )
        )
    bare_heads = (
        ("bare msg/s", "bare/MailDev", "durable msg/s", "durable/MailDev") if args.bare else ()
    )
    print(
        _stack.table(
            rows,
            (
                "",
                "sink msg/s",
                "MailDev msg/s",
                "sink/MailDev",
                *bare_heads,
                "refused",
                "first error",
            ),
        )
    )
    print()
    cpu_rows = []
    for n in counts:
        cpu = cpu_by_phase[n]
        acked = by[("sink", n)].acknowledged
        seconds = by[("sink", n)].seconds
        stack_ms = sum(cpu[k] for k in KINDS) / max(1, acked) * 1000
        cells = [f"{cpu[k] / max(1, acked) * 1000:.2f}" for k in ("smtp", "postgres", "worker")]
        cpu_rows.append(
            (
                f"sink, {n} connection(s)",
                *cells,
                f"{stack_ms:.2f}",
                f"{cpu['smtp'] / seconds * 100:.0f} %",
            )
        )
    print(
        _stack.table(
            cpu_rows,
            ("CPU ms/message", "smtp", "postgres", "worker", "all (stack)", "smtp, of a core"),
        )
    )
    print()
    verdict = "every 250 was a stored row" if stored == sink_acked else "MISMATCH"
    print(
        f"durability: sink answered 250 to {sink_acked} messages; sink_messages holds {stored}"
        f" rows: {verdict}"
    )
    print("machine")
    print(machine)


if __name__ == "__main__":
    sys.exit(main())
