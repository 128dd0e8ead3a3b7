"""A circuit breaker per provider, shared by every worker process through Redis.

States (per provider)::

    closed ──failure_threshold consecutive failures──▶ open
      ▲                                                  │ open_seconds (or a longer
      │                                                  ▼ Retry-After) elapse
      └────────────── probe succeeds ─────────────── half_open ──probe fails──▶ open

* **closed**: every call is allowed; a success resets the failure count.
* **open**: no call is allowed until ``open_until``.
* **half_open**: ``open_until`` has passed. Exactly one caller, across all
  processes, is admitted with ``probe=True`` (an atomic ``SET NX PX``); the
  others are refused until the probe reports. The probe slot expires after
  ``probe_timeout`` seconds, so a holder that dies never wedges the breaker:
  the next caller after expiry becomes the probe.

Every transition is one Lua script (``EVALSHA``), so concurrent workers never
see half a transition. Half-open is not stored: it is "open, and the clock is
past ``open_until``", so no process has to be awake at the instant it begins.

Redis keys (all under ``signalbox:breaker:``):

* ``state:{provider}``: hash with ``state`` (closed|open), ``failures``,
  ``open_until`` (epoch seconds, from the callers' clocks);
* ``probe:{provider}``: the probe slot, with a TTL in Redis time;
* ``index``: set of every provider that ever reported, for `snapshot_all`.

Usage in a check::

    breaker = CircuitBreaker(redis, provider.name)
    admission = breaker.before_call()
    if not admission.allowed:
        ...  # record a `circuit_open` check, retry at admission.retry_at
    try:
        messages = provider.search(query)
    except ProviderUnavailable as exc:
        breaker.record_failure(exc.retry_after)
        raise
    breaker.record_success()

Which errors count is the caller's choice; transient provider errors
(`ProviderUnavailable`) are the ones meant to.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis

from app.infra.redis import redis_client

KEY_PREFIX = "signalbox:breaker:"
INDEX_KEY = KEY_PREFIX + "index"

CLOSED = "closed"
HALF_OPEN = "half_open"
OPEN = "open"

# For the `signalbox_circuit_state` gauge (docs/api.md, "Metrics").
STATE_GAUGE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}

# KEYS: state, probe. ARGV: now, probe_ttl_ms, probe_token.
# Returns {state, allowed, probe, open_until or "", probe_pttl_ms or "",
# failures or ""}: failures is "" when no result was ever recorded.
_BEFORE_CALL = """
local st = redis.call('HGET', KEYS[1], 'state')
if st ~= 'open' then
  local failures = redis.call('HGET', KEYS[1], 'failures')
  return {'closed', 1, 0, '', '', failures or ''}
end
local open_until = redis.call('HGET', KEYS[1], 'open_until')
if tonumber(ARGV[1]) < tonumber(open_until) then
  return {'open', 0, 0, open_until, '', ''}
end
if redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[2]) then
  return {'half_open', 1, 1, open_until, '', ''}
end
return {'half_open', 0, 0, open_until, tostring(redis.call('PTTL', KEYS[2])), ''}
"""

# KEYS: state, probe, index. ARGV: provider, now.
# Returns the state after the call.
_RECORD_SUCCESS = """
redis.call('SADD', KEYS[3], ARGV[1])
local st = redis.call('HGET', KEYS[1], 'state')
if st == 'open' then
  local open_until = redis.call('HGET', KEYS[1], 'open_until')
  if tonumber(ARGV[2]) < tonumber(open_until) then
    -- A call admitted before the circuit opened came back late. The circuit
    -- stays open: it was opened on newer evidence (or a Retry-After).
    return 'open'
  end
end
redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0)
redis.call('HDEL', KEYS[1], 'open_until')
redis.call('DEL', KEYS[2])
return 'closed'
"""

# KEYS: state, probe, index.
# ARGV: provider, now, failure_threshold, reopen_until, retry_until or "".
# reopen_until = now + max(open_seconds, retry_after); retry_until = now + retry_after.
# Both are computed by the caller so that Redis stores them at full precision.
# Returns {state after the call, open_until or ""}.
_RECORD_FAILURE = """
redis.call('SADD', KEYS[3], ARGV[1])
local now = tonumber(ARGV[2])
local st = redis.call('HGET', KEYS[1], 'state')
if st == 'open' then
  local open_until = redis.call('HGET', KEYS[1], 'open_until')
  if now >= tonumber(open_until) then
    -- Half-open: the probe failed. Open again for a full period.
    redis.call('HSET', KEYS[1], 'open_until', ARGV[4])
    redis.call('DEL', KEYS[2])
    return {'open', ARGV[4]}
  end
  -- Already open: a late failure only extends the period by a longer Retry-After.
  if ARGV[5] ~= '' and tonumber(ARGV[5]) > tonumber(open_until) then
    redis.call('HSET', KEYS[1], 'open_until', ARGV[5])
    return {'open', ARGV[5]}
  end
  return {'open', open_until}
end
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
if failures >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'open_until', ARGV[4], 'failures', 0)
  redis.call('DEL', KEYS[2])
  return {'open', ARGV[4]}
end
redis.call('HSET', KEYS[1], 'state', 'closed')
return {'closed', ''}
"""


@dataclass(frozen=True)
class Admission:
    """Whether a caller may call the provider now.

    `probe` is True for the single caller admitted in half-open state: its
    `record_success` closes the circuit, its `record_failure` opens it again.
    `retry_at` (epoch seconds) is when asking again makes sense, for a
    refused caller; None when allowed. `clean` says the circuit was closed
    with no failure counted since the last recorded result: a success then
    changes nothing, and the caller need not record it (one Redis round
    trip less per call in the common case). A failure another process
    records meanwhile is then not reset by this success, only by the next
    caller's: the count errs towards opening, never towards staying closed.
    """

    allowed: bool
    probe: bool
    state: str
    retry_at: float | None
    clean: bool = False


@dataclass(eq=False)  # two breakers are the same only if they are one object
class CircuitBreaker:
    """The circuit breaker of one provider, its state kept in Redis.

    Cheap to construct (no I/O); make one per check or keep one per provider.
    `clock` gives epoch seconds and must agree across processes (wall time);
    it is injectable for tests. The probe slot's expiry (`probe_timeout`) is
    counted by Redis in real time.
    """

    redis: Redis
    provider: str
    failure_threshold: int = 5
    open_seconds: float = 30.0
    clock: Callable[[], float] = time.time
    probe_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if self.open_seconds <= 0 or self.probe_timeout <= 0:
            raise ValueError("open_seconds and probe_timeout must be positive")
        self._state_key = f"{KEY_PREFIX}state:{self.provider}"
        self._probe_key = f"{KEY_PREFIX}probe:{self.provider}"
        self._before_call = self.redis.register_script(_BEFORE_CALL)
        self._record_success = self.redis.register_script(_RECORD_SUCCESS)
        self._record_failure = self.redis.register_script(_RECORD_FAILURE)

    def before_call(self) -> Admission:
        """Ask to call the provider; at most one caller gets ``probe=True`` when half-open."""
        now = self.clock()
        reply = self._before_call(
            keys=[self._state_key, self._probe_key],
            args=[repr(now), max(1, int(self.probe_timeout * 1000)), _probe_token()],
        )
        state, allowed, probe, open_until, probe_pttl, failures = _texts(reply, 6)
        retry_at: float | None = None
        if not int(allowed):
            if state == OPEN:
                retry_at = float(open_until)
            else:
                # Refused while another caller probes: worth asking again once
                # the probe has reported or its slot has expired.
                pttl = int(probe_pttl) if probe_pttl.lstrip("-").isdigit() else 0
                retry_at = now + max(pttl, 0) / 1000.0
        return Admission(
            allowed=bool(int(allowed)),
            probe=bool(int(probe)),
            state=state,
            retry_at=retry_at,
            clean=state == CLOSED and failures == "0",
        )

    def record_success(self) -> None:
        """The provider answered: close the circuit (half-open) or reset the failure count."""
        self._record_success(
            keys=[self._state_key, self._probe_key, INDEX_KEY],
            args=[self.provider, repr(self.clock())],
        )

    def record_failure(self, retry_after: float | None = None) -> None:
        """The provider failed. Opens the circuit at the threshold, or again after a probe.

        A `retry_after` (seconds, from the provider's Retry-After) longer
        than `open_seconds` keeps the circuit open that long.
        """
        now = self.clock()
        retry = retry_after if retry_after is not None and retry_after > 0 else None
        reopen_until = now + max(self.open_seconds, retry or 0.0)
        retry_until = "" if retry is None else repr(now + retry)
        self._record_failure(
            keys=[self._state_key, self._probe_key, INDEX_KEY],
            args=[
                self.provider,
                repr(now),
                self.failure_threshold,
                repr(reopen_until),
                retry_until,
            ],
        )

    def clean(self) -> bool:
        """Closed with no failure counted: a call now would be admitted and its
        success would change nothing. One read, no transition (unlike
        `before_call`, it never takes the half-open probe)."""
        raw_state, failures = self.redis.hmget(self._state_key, ["state", "failures"])
        if raw_state is not None and _text(raw_state) == OPEN:
            return False
        return failures is not None and _text(failures) == "0"

    def state(self) -> str:
        """The current state: ``closed``, ``half_open`` or ``open``."""
        raw_state, raw_until = self.redis.hmget(self._state_key, ["state", "open_until"])
        return _derive_state(raw_state, raw_until, self.clock())

    @staticmethod
    def snapshot_all(redis: Redis, clock: Callable[[], float] = time.time) -> dict[str, str]:
        """States of every provider that ever reported (see module `snapshot_all`)."""
        return snapshot_all(redis, clock)


def snapshot_all(redis: Redis, clock: Callable[[], float] = time.time) -> dict[str, str]:
    """The state of every provider whose breaker ever recorded a result, for a gauge.

    A provider never seen is closed, and absent here. The view is read
    without a lock: good for metrics, not for decisions.
    """
    names = sorted(_text(name) for name in redis.smembers(INDEX_KEY))
    if not names:
        return {}
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hmget(f"{KEY_PREFIX}state:{name}", ["state", "open_until"])
    now = clock()
    return {
        name: _derive_state(raw_state, raw_until, now)
        for name, (raw_state, raw_until) in zip(names, pipe.execute(), strict=True)
    }


def _derive_state(raw_state: Any, raw_until: Any, now: float) -> str:
    if raw_state is None or _text(raw_state) != OPEN:
        return CLOSED
    if raw_until is None or now >= float(_text(raw_until)):
        return HALF_OPEN
    return OPEN


def _probe_token() -> str:
    # Who holds the probe, for someone reading Redis while debugging.
    return f"{os.getpid()}:{threading.get_ident()}:{time.time():.3f}"


def _text(value: Any) -> str:
    # The client may or may not have decode_responses set.
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _texts(reply: Any, count: int) -> Sequence[str]:
    if not isinstance(reply, list | tuple) or len(reply) != count:
        raise RuntimeError(f"unexpected reply from a circuit breaker script: {reply!r}")
    return [_text(item) for item in reply]


def breaker_for(provider: str) -> CircuitBreaker:
    """The breaker of `provider`, as settings configure it: what every process
    that checks a provider (worker, beat, sink) passes to a check."""
    from app.settings import get_settings

    settings = get_settings()
    return CircuitBreaker(
        redis_client(),
        provider,
        failure_threshold=settings.breaker_failure_threshold,
        open_seconds=settings.breaker_open_seconds,
    )
