"""A bulkhead per provider and worker: a slow provider cannot hold every
process of a worker.

A worker lets at most ``limit`` of its pool processes be in a call to one
provider at a time (by default all but one of them), so a provider that
answers slowly, holding each process it gets for as long as its calls take,
always leaves a process for every other provider's checks. A check refused a
slot makes no call: it is recorded as ``circuit_open`` with error code
``provider_busy`` (it spends no budget and is not a final look) and comes
back on the backoff.

Slots live in Redis: a sorted set per worker and provider, scored by when
each slot's lease ends. The check renews its slot while the call runs (with
its check lease), so a process killed mid-call stops renewing and its slot
lapses within a lease. Like the breaker, the bulkhead fails open: with its
Redis unreachable every call is let through.

Key (under ``signalbox:bulkhead:``): ``{worker}:{provider}``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

log = logging.getLogger("signalbox.bulkhead")

PREFIX = "signalbox:bulkhead:"
# Set by `signalbox-server worker` for its pool processes (they inherit it).
PROCESSES_ENV = "SIGNALBOX_WORKER_PROCESSES"

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
    redis.call('PEXPIRE', KEYS[1], ARGV[5])
    return 1
end
return 0
"""


def default_limit(processes: int | None = None) -> int:
    """All but one of the worker's processes (at least one)."""
    if processes is None:
        try:
            processes = int(os.environ.get(PROCESSES_ENV, "") or 0)
        except ValueError:
            processes = 0
        processes = processes or os.cpu_count() or 1
    return max(1, processes - 1)


class Slot:
    """One call's place in the bulkhead; `renew` while the call runs,
    `release` after it. Never raises."""

    def __init__(self, bulkhead: Bulkhead | None, token: str) -> None:
        self._bulkhead, self._token = bulkhead, token

    def renew(self) -> None:
        if self._bulkhead is not None:
            self._bulkhead._renew(self._token)

    def release(self) -> None:
        if self._bulkhead is not None:
            self._bulkhead._release(self._token)
            self._bulkhead = None


class Bulkhead:
    def __init__(
        self, redis: Any, worker: str, provider: str, *, limit: int, lease_seconds: float
    ) -> None:
        self.redis = redis
        self.key = f"{PREFIX}{worker}:{provider}"
        self.worker, self.provider = worker, provider
        self.limit = max(1, limit)
        self.lease = lease_seconds

    def acquire(self) -> Slot | None:
        """A slot, or None when `limit` calls of this worker to the provider
        are in flight."""
        token = uuid.uuid4().hex
        now = time.time()
        try:
            took = self.redis.eval(
                _ACQUIRE,
                1,
                self.key,
                now,
                self.limit,
                now + self.lease,
                token,
                self._key_ttl_ms(),
            )
        except Exception as exc:  # fail open: the call is made
            self._warn("bulkhead_unavailable", exc)
            return Slot(None, token)
        return Slot(self, token) if took else None

    def _renew(self, token: str) -> None:
        # The set's own expiry is pushed too: set only on acquire, it would
        # drop a slot renewed all along (and the limit with it) once no other
        # call had acquired for four leases.
        try:
            pipe = self.redis.pipeline()  # MULTI/EXEC: one round trip
            pipe.zadd(self.key, {token: time.time() + self.lease}, xx=True)
            pipe.pexpire(self.key, self._key_ttl_ms())
            pipe.execute()
        except Exception as exc:
            self._warn("bulkhead_renew_failed", exc)

    def _key_ttl_ms(self) -> int:
        return int(self.lease * 1000) * 4

    def _release(self, token: str) -> None:
        try:
            self.redis.zrem(self.key, token)
        except Exception as exc:  # the slot lapses with its lease
            self._warn("bulkhead_release_failed", exc)

    def _warn(self, event: str, exc: Exception) -> None:
        log.warning(
            "provider bulkhead unavailable; calling the provider anyway",
            extra={"event": event, "provider": self.provider, "error": type(exc).__name__},
        )
