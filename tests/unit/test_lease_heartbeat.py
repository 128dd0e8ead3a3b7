"""The check lease's heartbeat (app.usecases.checks.heartbeat): one thread per
process beats every keeper, from a third of its lease on, and a keeper once
left is never beaten again. Real threads and real time; the lease's
statement is recorded instead of run (the stack's tests run it for real:
tests/integration/test_slow_providers.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.usecases.checks import heartbeat
from app.usecases.checks.heartbeat import LeaseKeeper


@pytest.fixture
def beats(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """(the first signal id of each beat, when), as the lease statement saw them."""
    seen: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def no_transaction() -> Iterator[None]:
        yield None

    def extend(session: Any, fences: list[tuple[str, int]], lease: float) -> int:
        seen.append((fences[0][0], time.monotonic()))
        return len(fences)

    monkeypatch.setattr(heartbeat, "transaction", no_transaction)
    monkeypatch.setattr(heartbeat.takes_db, "signal_extend_check_leases", extend)
    return seen


def _beats_of(seen: list[tuple[str, float]], signal_id: str) -> int:
    return sum(1 for sid, _ in seen if sid == signal_id)


def test_a_short_check_is_never_beaten(beats: list[tuple[str, float]]) -> None:
    with LeaseKeeper([("sig_short", 1)], lease_seconds=3.0):
        time.sleep(0.05)
    time.sleep(1.2)  # past the first beat it would have had
    assert _beats_of(beats, "sig_short") == 0


def test_a_long_check_is_beaten_every_third_of_its_lease_until_it_ends(
    beats: list[tuple[str, float]],
) -> None:
    with LeaseKeeper([("sig_long", 1)], lease_seconds=0.6):
        entered = time.monotonic()
        time.sleep(0.75)  # beats near 0.2, 0.4 and 0.6 s
    during = _beats_of(beats, "sig_long")
    time.sleep(0.5)

    assert 2 <= during <= 4
    assert _beats_of(beats, "sig_long") == during  # none after it was left
    first = min(at for sid, at in beats if sid == "sig_long")
    assert first - entered >= 0.15  # not before a third of the lease


def test_checks_at_once_are_each_beaten_by_the_one_thread(
    beats: list[tuple[str, float]],
) -> None:
    before = {t.name for t in threading.enumerate()}
    with LeaseKeeper([("sig_a", 1)], 0.3), LeaseKeeper([("sig_b", 1)], 0.6):
        time.sleep(0.7)
        started = [t for t in threading.enumerate() if t.name not in before]
    assert _beats_of(beats, "sig_a") >= 4
    assert _beats_of(beats, "sig_b") >= 2
    assert len([t for t in started if t.name == "check-lease"]) <= 1


def test_leaving_waits_for_a_beat_in_flight_and_no_beat_follows(
    monkeypatch: pytest.MonkeyPatch, beats: list[tuple[str, float]]
) -> None:
    """A beat that lands after the check wrote its result would lease the
    signal again: leaving the keeper waits for the beat under way."""
    in_beat = threading.Event()
    release = threading.Event()
    keeper = LeaseKeeper([("sig_slow", 1)], lease_seconds=0.3)

    def slow_renew() -> None:
        in_beat.set()
        release.wait(5)

    keeper.also_renew = slow_renew
    keeper.__enter__()
    assert in_beat.wait(5)
    left = threading.Event()
    leaving = threading.Thread(target=lambda: (keeper.__exit__(None, None, None), left.set()))
    leaving.start()
    time.sleep(0.2)
    assert not left.is_set()  # the beat in flight holds it
    release.set()
    leaving.join(5)
    assert left.is_set()
    count = _beats_of(beats, "sig_slow")
    time.sleep(0.4)
    assert _beats_of(beats, "sig_slow") == count
