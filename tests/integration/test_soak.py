"""The soak harness, CI-sized: ~90 short-lived signals on the three providers under
one fault of each kind; every invariant must hold (nothing lost, nothing taken
twice, checks and dead letters accounted for, nothing left waiting).

It runs the whole of bench/soak.py: its own PostgreSQL (restarted), Redis
(restarted), MailDev and Dovecot (stopped, slowed), API, sink, two workers
(killed), a dead-letter consumer and beat. The assertion message is the
invariant table with examples, the faults and the machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import FAULTS, Options, run_soak
from bench.soak_world import Tuning

pytestmark = [pytest.mark.integration, pytest.mark.providers]

CI_SOAK = Options(
    signals=90,
    duration=20.0,
    providers=["sink", "maildev", "imap"],
    faults=list(FAULTS),
    fault_count=len(FAULTS),
    seed=20261130,
    window_min=12,
    window_max=25,
    provider_outage=8.0,
    broker_outage=2.0,
    postgres_outage=2.0,
    slow_for=8.0,
    push_interval=2.0,
    busy_messages=520,  # the sink's busy address: more than one page of older mail
    busy_maildev=150,
    grace=8.0,
    dlq_drain=10.0,
    threads=16,
    tuning=Tuning(check_lease=6.0),
)


# Starting the world (PostgreSQL, Redis, MailDev, Dovecot, six Signalbox
# processes) takes most of the time on a busy machine; the soak itself ~50 s.
@pytest.mark.timeout(420)
def test_soak_under_every_kind_of_fault_loses_nothing_and_keeps_every_invariant(
    tmp_path: Path,
) -> None:
    outcome = run_soak(CI_SOAK, root=tmp_path / "soak", log=print)

    assert set(outcome.faults) == set(FAULTS), outcome.render()
    assert outcome.report.violations == 0, "\n" + outcome.render()
