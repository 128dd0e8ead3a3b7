"""The provider bulkhead on a real Redis: at most `limit` slots per worker
and provider, freed on release, lapsed when a slot's holder stops renewing
it (a killed process), kept while it renews, and open when Redis is gone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from app.providers import bulkhead as bulkhead_module
from app.providers.bulkhead import Bulkhead, default_limit

pytestmark = pytest.mark.integration


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    handle = redis.Redis.from_url(redis_url)
    yield handle
    handle.close()


def bulkhead(client: redis.Redis, *, limit: int = 2, lease: float = 30.0) -> Bulkhead:
    # A unique worker name: tests sharing a Redis never see each other.
    return Bulkhead(client, f"w-{uuid.uuid4().hex[:8]}", "slow", limit=limit, lease_seconds=lease)


def test_at_most_limit_calls_hold_a_slot_and_a_release_frees_one(client: redis.Redis) -> None:
    head = bulkhead(client, limit=2)
    first, second = head.acquire(), head.acquire()
    assert first is not None and second is not None
    assert head.acquire() is None

    first.release()
    third = head.acquire()
    assert third is not None
    assert head.acquire() is None


def test_workers_and_providers_have_bulkheads_of_their_own(client: redis.Redis) -> None:
    head = bulkhead(client, limit=1)
    assert head.acquire() is not None
    other_worker = Bulkhead(client, "another", head.provider, limit=1, lease_seconds=30)
    other_provider = Bulkhead(client, head.worker, "fast", limit=1, lease_seconds=30)
    assert other_worker.acquire() is not None
    assert other_provider.acquire() is not None


class FakeClock:
    """Stands in for the `time` module the bulkhead reads its clock from."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_a_renewal_keeps_the_set_alive_past_its_expiry_from_the_last_acquire(
    client: redis.Redis,
) -> None:
    """The set of slots expires four leases after the last write to it: a
    call renewing its slot for longer, with no other call acquiring, must
    keep it (else the limit lapses with the set while the call runs)."""
    head = bulkhead(client, limit=1, lease=30.0)
    slot = head.acquire()
    assert slot is not None
    # As if the acquire were long ago: a second of the set's expiry left.
    client.pexpire(head.key, 1000)
    slot.renew()
    assert client.pttl(head.key) > 60_000
    assert head.acquire() is None  # the renewed slot still holds the only place


def test_a_slot_whose_holder_stops_renewing_lapses_and_one_renewed_is_kept(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot not renewed for a lease is free for the next caller; a slot
    renewed all along is still held after twice the lease."""
    # A slot lapses when the score its holder's clock gave it is passed, so a
    # fake clock moved by hand makes the lapse exact whatever the delays.
    # The long lease keeps the set's own Redis expiry (set on acquire, in
    # real time) far beyond the test.
    clock = FakeClock()
    monkeypatch.setattr(bulkhead_module, "time", clock)
    head = bulkhead(client, limit=2, lease=30.0)
    dead, alive = head.acquire(), head.acquire()
    assert dead is not None and alive is not None
    for _ in range(4):  # 60 s: twice the lease
        clock.advance(15.0)
        alive.renew()
    assert head.acquire() is not None  # the dead holder's slot lapsed
    assert head.acquire() is None  # the renewed one is still held


def test_an_unreachable_redis_lets_every_call_through() -> None:
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    head = Bulkhead(gone, "w", "slow", limit=1, lease_seconds=30)
    slots = [head.acquire(), head.acquire()]
    assert all(slot is not None for slot in slots)
    for slot in slots:
        assert slot is not None
        slot.renew()
        slot.release()


def test_the_default_leaves_one_process_for_other_providers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert default_limit(2) == 1
    assert default_limit(8) == 7
    assert default_limit(1) == 1
    monkeypatch.setenv("SIGNALBOX_WORKER_PROCESSES", "4")
    assert default_limit() == 3
