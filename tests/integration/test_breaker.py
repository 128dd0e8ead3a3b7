"""The shared circuit breaker against a real Redis, with threads and processes.

Time is a fake clock where the test moves it by hand, except where Redis
itself counts (the probe slot's expiry) or where separate processes must
agree (they use the wall clock).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from app.domain.states import CheckOutcome
from app.errors import ProviderUnavailable
from app.providers.base import SearchQuery
from app.providers.breaker import KEY_PREFIX, Admission, CircuitBreaker, snapshot_all
from app.providers.maildev import MaildevProvider
from app.usecases.checks.call import ask_provider
from tests.servers import (
    CountingProxy,
    ScriptedHttpServer,
    ScriptedResponse,
    TestRedis,
    redis_server,
)
from tests.stack import wait_until

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TestRedis]:
    with redis_server(tmp_path) as handle:
        yield handle


@pytest.fixture
def provider_name() -> str:
    # Unique, so that tests sharing an external Redis never see each other.
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _breaker(store: TestRedis, name: str, clock: FakeClock, **kwargs: float) -> CircuitBreaker:
    options: dict[str, float] = {"failure_threshold": 3, "open_seconds": 30.0}
    options.update(kwargs)
    return CircuitBreaker(
        store.client,
        name,
        failure_threshold=int(options.pop("failure_threshold")),
        clock=clock,
        **options,
    )


def _open(breaker: CircuitBreaker, retry_after: float | None = None) -> None:
    for _ in range(breaker.failure_threshold):
        assert breaker.before_call().allowed
        breaker.record_failure(retry_after)
    assert breaker.state() == "open"


def test_closed_breaker_admits_calls_without_probe(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)

    assert breaker.state() == "closed"
    assert breaker.before_call() == Admission(
        allowed=True, probe=False, state="closed", retry_at=None
    )


def test_an_admission_is_clean_only_when_a_success_would_change_nothing(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    """`clean` lets a caller skip recording a success: only when the circuit
    is closed with no failure counted since a recorded result. Never before
    the first result (the provider is not in the gauge's index yet), never
    with a failure to reset, never half-open."""
    breaker = _breaker(store, provider_name, clock)
    assert not breaker.before_call().clean  # nothing recorded yet

    breaker.record_success()
    assert breaker.before_call().clean

    breaker.record_failure()
    assert not breaker.before_call().clean  # a success must reset this count
    breaker.record_success()
    assert breaker.before_call().clean

    _open(breaker)
    assert not breaker.before_call().clean
    clock.advance(30.0)
    probe = breaker.before_call()
    assert probe.probe and not probe.clean  # the probe's success must close it


class _CountingBreaker:
    """A real breaker that counts the successes recorded through it."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker, self.successes = breaker, 0

    def before_call(self) -> Admission:
        return self.breaker.before_call()

    def record_success(self) -> None:
        self.successes += 1
        self.breaker.record_success()

    def record_failure(self, retry_after: float | None = None) -> None:
        self.breaker.record_failure(retry_after)


class _Answering:
    name = "answering"

    def search(self, query: SearchQuery) -> list[object]:
        return []


def test_a_check_records_a_success_only_when_it_changes_the_breaker(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    """`ask_provider` skips the Redis round trip of a success that changes
    nothing, and still resets a failure count with it."""
    counting = _CountingBreaker(_breaker(store, provider_name, clock))
    query = SearchQuery(recipients=["a@example.test"], since=datetime.now(UTC))

    def ask() -> None:
        answer = ask_provider(_Answering(), lambda name: counting, query)  # type: ignore[arg-type]
        assert answer.outcome is CheckOutcome.NO_MATCH

    ask()
    assert counting.successes == 1  # the first result is recorded
    ask()
    ask()
    assert counting.successes == 1  # closed and clean: nothing to record

    counting.breaker.record_failure()
    counting.breaker.record_failure()
    ask()
    assert counting.successes == 2  # the success reset the count...
    counting.breaker.record_failure()
    counting.breaker.record_failure()
    assert counting.breaker.state() == "closed"  # ...so two more do not open it


def test_opens_when_consecutive_failures_reach_the_threshold(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)

    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state() == "closed"
    assert breaker.before_call().allowed

    breaker.record_failure()

    assert breaker.state() == "open"
    admission = breaker.before_call()
    assert admission == Admission(
        allowed=False, probe=False, state="open", retry_at=clock.now + 30.0
    )


def test_a_success_resets_the_count_so_only_consecutive_failures_open(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)

    for _ in range(4):
        breaker.record_failure()
        breaker.record_failure()
        breaker.record_success()

    assert breaker.state() == "closed"


def test_state_is_shared_by_every_breaker_object_on_the_same_redis(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    other_client = redis.Redis.from_url(store.url)
    try:
        here = _breaker(store, provider_name, clock)
        there = CircuitBreaker(other_client, provider_name, failure_threshold=3, clock=clock)
        here.record_failure()
        there.record_failure()
        here.record_failure()

        assert there.state() == "open"
        assert not there.before_call().allowed
    finally:
        other_client.close()


def test_no_request_reaches_the_provider_while_open(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)
    with (
        ScriptedHttpServer({"/email": ScriptedResponse(503, b"down")}) as upstream,
        CountingProxy("127.0.0.1", upstream.port) as proxy,
    ):
        provider = MaildevProvider(name=provider_name, url=proxy.url, timeout=5.0)

        def check() -> Admission:
            admission = breaker.before_call()
            if admission.allowed:
                try:
                    provider.search(SearchQuery(since=datetime.now(UTC)))
                except ProviderUnavailable as exc:
                    breaker.record_failure(exc.retry_after)
                else:
                    breaker.record_success()
                finally:
                    # A new connection per call, so the proxy counts calls.
                    provider.close()
            return admission

        for _ in range(3):
            assert check().allowed
        assert breaker.state() == "open"
        calls, connections = len(upstream.requests), proxy.connections
        assert (calls, connections) == (3, 3)

        for _ in range(20):
            assert not check().allowed
            clock.advance(1.0)

        assert len(upstream.requests) == calls
        assert proxy.connections == connections

        clock.advance(10.0)
        probe = check()
        assert probe.probe
        assert (len(upstream.requests), proxy.connections) == (calls + 1, connections + 1)


def test_after_open_seconds_exactly_one_of_many_concurrent_threads_gets_the_probe(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    _open(_breaker(store, provider_name, clock))
    clock.advance(30.0)
    callers = 32
    barrier = threading.Barrier(callers)
    results: list[Admission] = []
    lock = threading.Lock()

    def call() -> None:
        # Each thread its own client and connection, as separate workers would be.
        client = redis.Redis.from_url(store.url)
        try:
            breaker = CircuitBreaker(client, provider_name, failure_threshold=3, clock=clock)
            barrier.wait()
            admission = breaker.before_call()
            with lock:
                results.append(admission)
        finally:
            client.close()

    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert len(results) == callers
    probes = [a for a in results if a.probe]
    assert len(probes) == 1
    assert probes[0].allowed and probes[0].state == "half_open"
    refused = [a for a in results if not a.probe]
    assert all(not a.allowed and a.state == "half_open" for a in refused)
    assert all(a.retry_at is not None and a.retry_at > clock.now for a in refused)


def _probe_in_process(url: str, provider: str, barrier: object, results: object) -> None:
    client = redis.Redis.from_url(url)
    try:
        breaker = CircuitBreaker(client, provider, failure_threshold=1, open_seconds=0.2)
        barrier.wait()  # type: ignore[attr-defined]
        admission = breaker.before_call()
        results.put((admission.allowed, admission.probe, admission.state))  # type: ignore[attr-defined]
    finally:
        client.close()


def test_exactly_one_of_several_worker_processes_gets_the_probe(
    store: TestRedis, provider_name: str
) -> None:
    breaker = CircuitBreaker(store.client, provider_name, failure_threshold=1, open_seconds=0.2)
    breaker.record_failure()
    assert breaker.state() == "open"
    time.sleep(0.3)  # the wall clock: every process reads its own
    context = multiprocessing.get_context("spawn")
    processes_count = 6
    barrier = context.Barrier(processes_count)
    results = context.Queue()
    processes = [
        context.Process(target=_probe_in_process, args=(store.url, provider_name, barrier, results))
        for _ in range(processes_count)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
    results.close()
    results.join_thread()

    assert all(process.exitcode == 0 for process in processes)
    assert sorted(outcomes) == [(False, False, "half_open")] * 5 + [(True, True, "half_open")]


def test_probe_success_closes_the_breaker(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)
    _open(breaker)
    clock.advance(30.0)
    assert breaker.state() == "half_open"
    assert breaker.before_call().probe

    breaker.record_success()

    assert breaker.state() == "closed"
    assert breaker.before_call() == Admission(True, False, "closed", None, clean=True)
    # Closed with a fresh count: it takes a full threshold to open again.
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state() == "closed"


def test_probe_failure_opens_the_breaker_again_for_a_full_period(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)
    _open(breaker)
    clock.advance(31.0)
    assert breaker.before_call().probe

    breaker.record_failure()

    assert breaker.state() == "open"
    assert breaker.before_call().retry_at == clock.now + 30.0
    clock.advance(29.9)
    assert not breaker.before_call().allowed
    clock.advance(0.1)
    # A new probe slot: the failed probe's slot was released.
    assert breaker.before_call().probe


def test_a_retry_after_longer_than_open_seconds_keeps_it_open_that_long(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)
    opened_at = clock.now

    _open(breaker, retry_after=120.0)

    assert breaker.before_call().retry_at == opened_at + 120.0
    clock.advance(60.0)
    assert breaker.state() == "open"
    assert not breaker.before_call().allowed
    clock.advance(60.0)
    assert breaker.state() == "half_open"
    assert breaker.before_call().probe


def test_a_retry_after_shorter_than_open_seconds_does_not_shorten_it(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)

    _open(breaker, retry_after=2.0)

    clock.advance(10.0)
    assert breaker.state() == "open"


def test_a_late_failure_with_a_long_retry_after_extends_an_open_breaker(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)
    _open(breaker)
    clock.advance(5.0)

    # A call admitted before the breaker opened comes back rate limited.
    breaker.record_failure(retry_after=300.0)

    assert breaker.before_call().retry_at == clock.now + 300.0


def test_a_late_success_does_not_close_a_breaker_that_is_still_open(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    breaker = _breaker(store, provider_name, clock)
    _open(breaker, retry_after=120.0)

    breaker.record_success()

    assert breaker.state() == "open"


def test_a_dead_probe_holders_slot_expires_and_another_caller_probes(
    store: TestRedis, provider_name: str, clock: FakeClock
) -> None:
    """The probe slot of a holder that never reports lapses with its TTL
    (counted by Redis); until then others are refused, after it one probes."""
    # Redis counts the slot's TTL in real time: 3 s leaves the two calls below
    # (which must both see the slot held) ample room on a stalled machine.
    breaker = _breaker(store, provider_name, clock, probe_timeout=3.0)
    _open(breaker)
    clock.advance(30.0)

    dead_holder = breaker.before_call()
    assert dead_holder.probe  # ...and it never reports back
    refused = breaker.before_call()
    assert not refused.allowed
    assert refused.retry_at is not None and refused.retry_at <= clock.now + 3.0

    probe_key = f"{KEY_PREFIX}probe:{provider_name}"
    assert 0 < store.client.pttl(probe_key) <= 3000  # the slot lapses within probe_timeout
    # Waiting for the slot itself to be gone (not for a fixed time) is
    # exact whatever the delays.
    wait_until(lambda: not store.client.exists(probe_key), 10, what="the probe slot to lapse")

    assert breaker.before_call().probe
    assert not breaker.before_call().allowed


def test_snapshot_all_reports_every_provider_state(store: TestRedis, clock: FakeClock) -> None:
    prefix = f"snap-{uuid.uuid4().hex[:8]}"
    closed = _breaker(store, f"{prefix}-closed", clock)
    opened = _breaker(store, f"{prefix}-open", clock, open_seconds=100.0)
    half = _breaker(store, f"{prefix}-half", clock, open_seconds=10.0)
    closed.record_failure()
    _open(opened)
    _open(half)
    clock.advance(20.0)

    states = snapshot_all(store.client, clock)

    mine = {name: state for name, state in states.items() if name.startswith(prefix)}
    assert mine == {
        f"{prefix}-closed": "closed",
        f"{prefix}-open": "open",
        f"{prefix}-half": "half_open",
    }
    assert CircuitBreaker.snapshot_all(store.client, clock) == states
