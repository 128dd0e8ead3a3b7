"""Metrics on real processes: every metric docs/api.md lists ("Metrics") on
the API's `/metrics`, counters summed over the API and every Celery prefork
child (multiprocess mode), and, with SIGNALBOX_METRICS_PORT, each worker
process serving its own counters while one chosen kind of process serves the
database gauges."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import create_signal, db_scalar, mail
from tests.servers import MaildevServer, free_port
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

DOCUMENTED_METRICS = {
    # family name -> (type, label names)
    "signalbox_signals_created": ("counter", {"namespace"}),
    "signalbox_signal_time_to_found_seconds": ("histogram", {"provider"}),
    "signalbox_checks": ("counter", {"provider", "outcome"}),
    "signalbox_provider_call_seconds": ("histogram", {"provider"}),
    "signalbox_messages_mismatched": ("counter", {"provider", "why"}),
    "signalbox_leases_lapsed": ("counter", {"namespace"}),
    "signalbox_signals": ("gauge", {"status"}),
    "signalbox_oldest_due_signal_age_seconds": ("gauge", set()),
    "signalbox_db_oldest_transaction_age_seconds": ("gauge", set()),
    "signalbox_dead_letters": ("gauge", {"reason", "state", "namespace"}),
    "signalbox_circuit_state": ("gauge", {"provider"}),
    "signalbox_smtp_refused": ("counter", {"reason"}),
}


def scrape(stack: Stack | str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Sample name -> [(sample name, labels, value)], grouped by family; of the
    API's /metrics or of a metrics URL."""
    url = stack if isinstance(stack, str) else f"{stack.api_url}/metrics"
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        family.name: [(s.name, s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(response.text)
    }


def sample_sum(families: dict, family: str, sample: str, **labels: str) -> float:
    return sum(
        value
        for name, got, value in families.get(family, [])
        if name == sample and all(got.get(k) == v for k, v in labels.items())
    )


def test_every_contract_metric_is_exposed_with_its_labels(stack: Stack) -> None:
    found = create_signal(stack, subject_contains="welcome")
    # A near miss first (wrong subject), then the message that matches.
    stack.send(mail(found["recipient"], "Your invoice", found["run_id"]), [found["recipient"]])
    stack.send(mail(found["recipient"], "Welcome!", found["run_id"]), [found["recipient"]])
    with stack.client() as api:
        view = api.get(f"/v1/signals/{found['signal_id']}", params={"wait": 20}).json()
    assert view["status"] == "found"

    families = scrape(stack)

    for name, (kind, labels) in DOCUMENTED_METRICS.items():
        assert name in families, f"{name} is not exposed"
        sample_names = {s for s, _, _ in families[name]}
        if kind == "histogram":
            assert {name + "_bucket", name + "_sum", name + "_count"} <= sample_names
        elif kind == "gauge":
            assert sample_names == {name}
        if kind == "counter":
            # A counter nothing incremented yet (a lapse, here) is declared without samples.
            assert sample_names <= {name + "_total"}, sample_names
        for _, got, _ in families[name]:
            assert set(got) - {"le"} == labels, (name, got)
    assert (
        sample_sum(
            families,
            "signalbox_signals_created",
            "signalbox_signals_created_total",
            namespace="default",
        )
        >= 1
    )
    assert (
        sample_sum(
            families,
            "signalbox_checks",
            "signalbox_checks_total",
            provider="sink",
            outcome="matched",
        )
        >= 1
    )
    assert (
        sample_sum(
            families,
            "signalbox_messages_mismatched",
            "signalbox_messages_mismatched_total",
            provider="sink",
            why="subject_mismatch",
        )
        >= 1
    )
    assert sample_sum(families, "signalbox_signals", "signalbox_signals", status="found") == 1
    assert (
        sample_sum(families, "signalbox_circuit_state", "signalbox_circuit_state", provider="sink")
        == 0
    )


def _oldest_transaction(stack: Stack) -> float:
    name = "signalbox_db_oldest_transaction_age_seconds"
    return sample_sum(scrape(stack), name, name)


def test_the_oldest_transaction_gauge_shows_a_transaction_left_idle(stack: Stack) -> None:
    """Issue 51: a client that opens a transaction and goes quiet pins the xmin
    horizon; the gauge says how long it has been open, and falls back once it ends."""
    url = stack.env["SIGNALBOX_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as idle:  # not autocommit: the SELECT opens a transaction
        idle.execute("SELECT count(*) FROM signals").fetchone()
        time.sleep(3.0)
        held = _oldest_transaction(stack)
        assert held >= 3.0, held
        idle.rollback()
        after = _oldest_transaction(stack)
    assert after < 3.0, after


def _pids_with(metrics_dir: Path, key_part: str) -> set[str]:
    pids = set()
    for path in metrics_dir.glob("counter_*.db"):
        keys = [key for key, *_ in MmapedDict.read_all_values_from_file(str(path))]
        if any(key_part in key for key in keys):
            pids.add(path.stem.split("_", 1)[1])
    return pids


def _one_check_each(stack: Stack, count: int, expires_in: int = 6) -> list[str]:
    """`count` signals of one check each (max_checks 1: the one check is the
    deadline's) of the polled provider `md`, whose checks the worker makes,
    waited for until every signal of the database has used its check and
    expired `expires_in` seconds after its creation: their ids."""
    ids = [
        create_signal(stack, provider="md", expires_in_seconds=expires_in, max_checks=1)[
            "signal_id"
        ]
        for _ in range(count)
    ]
    wait_until(
        lambda: (
            db_scalar(stack, "SELECT count(*) FILTER (WHERE status <> 'expired') FROM signals") == 0
        ),
        40,
        interval=0.2,
        what="every signal to use up its check",
    )
    return ids


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _replace_the_child(stack: Stack, name: str) -> tuple[int, int]:
    """SIGKILL the one prefork child of worker `name` and wait for the pool's
    new one: (the old pid, the new pid)."""
    parent = stack.procs[name].pid
    (old,) = _children(parent)
    os.kill(old, signal.SIGKILL)
    (new,) = wait_until(
        lambda: [c for c in _children(parent) if c != old], 30, what="the pool's new child"
    )
    return old, new


def _stop_consuming(stack: Stack, name: str, queue: str) -> None:
    """Worker `name` stops taking tasks from `queue` (Celery's remote control,
    answered once done); it keeps running."""
    from celery import Celery

    control = Celery(broker=stack.env["SIGNALBOX_BROKER_URL"])
    try:
        replies = control.control.cancel_consumer(
            queue, destination=[stack.nodes[name]], reply=True, timeout=10
        )
    finally:
        control.close()
    assert replies, f"{name} did not answer cancel_consumer"


@pytest.mark.providers
def test_checks_of_every_worker_child_are_counted_and_survive_a_worker_restart(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    stack = stack_factory()
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.md]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )
    stack.start(worker=False, beat=True)
    # One prefork child at a time, replaced between two rounds of checks: each
    # child does a round (which child takes a task is never Celery's choice).
    stack.start_worker(concurrency=1)
    metrics_dir = Path(stack.env["SIGNALBOX_DATA_DIR"]) / "metrics"
    ids = _one_check_each(stack, 15)
    first, second = _replace_the_child(stack, "worker")
    ids += _one_check_each(stack, 15)
    check_rows = db_scalar(stack, "SELECT count(*) FROM checks")

    families = scrape(stack)
    counted = sample_sum(families, "signalbox_checks", "signalbox_checks_total")

    # Every check row is counted once; a check the bulkhead refused (the
    # signals of a round share one deadline) is a row too, and is made again.
    assert counted == check_rows >= len(ids)
    # Both prefork children did checks, each in its own file: the scrape summed them.
    assert {str(first), str(second)} <= _pids_with(metrics_dir, '"signalbox_checks_total"')
    assert sample_sum(families, "signalbox_signals", "signalbox_signals", status="expired") == len(
        ids
    )
    assert sample_sum(
        families,
        "signalbox_dead_letters",
        "signalbox_dead_letters",
        reason="deadline",
        state="open",
    ) == len(ids)

    # A killed worker's counts are folded into the archive when the next one starts.
    stack.kill("worker")
    stack.start_worker(concurrency=1)
    assert _pids_with(metrics_dir, '"signalbox_checks_total"') == {"archive"}
    after = scrape(stack)
    assert sample_sum(after, "signalbox_checks", "signalbox_checks_total") == check_rows


# Three processes to start, then a round of checks for each worker.
@pytest.mark.providers
@pytest.mark.timeout(300)
def test_each_worker_serves_its_own_counters_on_its_metrics_port(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """With SIGNALBOX_METRICS_PORT each worker serves its own check counters
    (together all the checks, none on the API), only beat serves the
    database gauges, and a prefork child's death loses none of the counts."""
    # Beat serves the database gauges only: a first look left to its sweep
    # would be re-sent by beat, and might be counted twice over the rounds.
    stack = stack_factory({"SIGNALBOX_REQUEUE_AFTER_SECONDS": "600"})
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.md]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )
    stack.start_api()
    ports = {"w1": free_port(), "w2": free_port(), "beat": free_port()}
    stack.spawn(
        "beat",
        ["beat"],
        {"SIGNALBOX_METRICS_PORT": str(ports["beat"]), "SIGNALBOX_METRICS_DB_GAUGES": "true"},
    )

    def checks_of(name: str) -> float:
        return sample_sum(
            scrape(f"http://127.0.0.1:{ports[name]}/metrics"),
            "signalbox_checks",
            "signalbox_checks_total",
        )

    # Which worker takes a task is the broker's choice: each round has one
    # worker consuming, w1 alone, then w2 alone (w1 still runs and serves).
    stack.start_worker("w1", extra_env={"SIGNALBOX_METRICS_PORT": str(ports["w1"])})
    # A check the bulkhead refused (both children busy) leaves the signal's one
    # check for its deadline: a short one keeps the rounds short.
    ids = _one_check_each(stack, 12, expires_in=6)
    stack.start_worker("w2", extra_env={"SIGNALBOX_METRICS_PORT": str(ports["w2"])})
    _stop_consuming(stack, "w1", "signals")
    ids += _one_check_each(stack, 12, expires_in=6)
    per_worker = {name: checks_of(name) for name in ("w1", "w2")}
    check_rows = db_scalar(stack, "SELECT count(*) FROM checks")
    # Each worker counts its own checks only; together they are all of them.
    assert per_worker["w1"] > 0 and per_worker["w2"] > 0, per_worker
    assert per_worker["w1"] + per_worker["w2"] == check_rows
    # Their files are private to each process tree: the API's /metrics does not see them.
    assert sample_sum(scrape(stack), "signalbox_checks", "signalbox_checks_total") == 0

    # The database gauges come from the one kind of process told to serve them.
    w1 = scrape(f"http://127.0.0.1:{ports['w1']}/metrics")
    assert "signalbox_signals" not in w1 and "signalbox_dead_letters" not in w1
    beat = scrape(f"http://127.0.0.1:{ports['beat']}/metrics")
    assert sample_sum(beat, "signalbox_signals", "signalbox_signals", status="expired") == len(ids)
    # Every one of them is an open dead letter (the budget or the deadline, as
    # the polled provider's one check fell).
    assert sample_sum(
        beat,
        "signalbox_dead_letters",
        "signalbox_dead_letters",
        state="open",
        namespace="default",
    ) == len(ids)
    assert (
        sample_sum(beat, "signalbox_dead_letters", "signalbox_dead_letters", namespace="other") == 0
    )

    # A prefork child's death loses none of its worker's counts.
    child = _children(stack.procs["w1"].pid)[0]
    os.kill(child, signal.SIGKILL)
    wait_until(
        lambda: child not in _children(stack.procs["w1"].pid), 20, what="the child to be gone"
    )
    after = scrape(f"http://127.0.0.1:{ports['w1']}/metrics")
    assert sample_sum(after, "signalbox_checks", "signalbox_checks_total") == per_worker["w1"]
