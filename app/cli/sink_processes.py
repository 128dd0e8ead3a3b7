"""`signalbox-server smtp` with SIGNALBOX_SMTP_PROCESSES > 1: a supervisor and
its sink processes.

One aiosmtpd event loop was the sink's limit on a machine of several cores.
Each sink process binds the SMTP port (and the SMTPS port) with SO_REUSEPORT,
so the kernel spreads new connections among them; each has its own event
loop, parse pool, group commit and connections to PostgreSQL. The supervisor
serves nothing itself: it makes the TLS certificate once, serves the metrics
port of the whole tree (SIGNALBOX_METRICS_PORT; the sink processes write
their counters into its metrics directory), starts the sink processes
(`smtp --process I/N`) and restarts one that dies, as uvicorn restarts an API
worker process and Celery a prefork child. A sink process that exits on its
own right after its start (its port, settings or certificate are wrong)
would exit again, so that one ends the supervisor (exit 1); one killed by a
signal (the OOM killer, an operator's SIGKILL) is restarted however young,
unless it is the third in a row to die young.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from app.settings import Settings

log = logging.getLogger("signalbox.smtp")

# A sink process that exits on its own sooner than this after its start is
# not restarted (its port, settings or certificate are wrong: it would exit
# again); one killed by a signal that soon is, up to EARLY_DEATHS in a row.
MIN_LIFETIME_SECONDS = 5.0
EARLY_DEATHS = 3
STOP_GRACE_SECONDS = 12.0
POLL_SECONDS = 0.5


def parse_process_arg(value: str) -> tuple[int, int]:
    """`I/N` of `smtp --process` (1 ≤ I ≤ N)."""
    index, _, count = value.partition("/")
    i, n = int(index), int(count)
    if not 1 <= i <= n:
        raise ValueError(value)
    return i, n


@dataclass
class _SinkProcess:
    index: int
    proc: subprocess.Popen[bytes]
    started: float
    # How many of this slot's processes in a row died young (before it).
    early_deaths: int = 0


def gives_up(code: int, lived: float, early_deaths: int) -> bool:
    """Whether a sink process that ended with `code` (negative: killed by
    that signal) after `lived` seconds, the slot's `early_deaths`-th young
    death in a row before it, ends the supervisor rather than being restarted."""
    if lived >= MIN_LIFETIME_SECONDS:
        return False
    return code >= 0 or early_deaths + 1 >= EARLY_DEATHS


def _start(index: int, count: int) -> _SinkProcess:
    from app.cli.up import parent_death_signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "smtp", "--process", f"{index}/{count}"],
        # In the supervisor's process group: whoever stops the group stops them.
        preexec_fn=parent_death_signal(),
    )
    return _SinkProcess(index, proc, time.monotonic())


def _report(line: str) -> None:
    print(f"signalbox-server: {line}", file=sys.stderr, flush=True)


def supervise(settings: Settings) -> int:
    """Run `settings.smtp_processes` sink processes until SIGINT or SIGTERM;
    0, or 1 when a sink process died right after its start."""
    from app.observability.metrics import compact_dead_processes
    from app.smtp.tls import server_context, tls_wanted

    if tls_wanted(settings):
        # Made (or checked) once, before the processes read it: a certificate
        # that cannot be used stops the start naming its setting.
        server_context(settings)
    count = settings.smtp_processes
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sinks = [_start(i, count) for i in range(1, count + 1)]
    exit_code = 0
    while not stopping.wait(POLL_SECONDS):
        for n, sink in enumerate(sinks):
            code = sink.proc.poll()
            if code is None or stopping.is_set():
                continue
            lived = time.monotonic() - sink.started
            what = f"smtp process {sink.index}/{count} (pid {sink.proc.pid}) exited with {code}"
            log.warning(
                "sink process %d/%d exited",
                sink.index,
                count,
                extra={"event": "smtp_process_exited", "outcome": str(code)},
            )
            young = lived < MIN_LIFETIME_SECONDS
            if gives_up(code, lived, sink.early_deaths):
                _report(f"{what} {lived:.1f} s after its start; stopping")
                exit_code = 1
                stopping.set()
                break
            # Its counters stay in the metrics directory; fold its file now.
            compact_dead_processes()
            sinks[n] = _start(sink.index, count)
            sinks[n].early_deaths = sink.early_deaths + 1 if young else 0
            _report(f"{what}; restarted as pid {sinks[n].proc.pid}")
    _stop([s.proc for s in sinks])
    return exit_code


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
