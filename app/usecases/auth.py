"""Who is calling: a bearer token resolved to a principal.

A token belongs to exactly one namespace (a tenant) or is an operator's
(`SIGNALBOX_OPS_TOKENS`): an operator triages every namespace but never
claims, consumes or reads content (docs/api.md, "Operators").
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from datetime import UTC, datetime

from redis.exceptions import RedisError

from app.db import console_sessions as console_sessions_db
from app.db import tokens as tokens_db
from app.db.engine import transaction
from app.domain.ids import token_hash
from app.errors import TooManyRequests
from app.infra.redis import READ_TIMEOUT_SECONDS, client_for, is_redis_url, redis_url
from app.settings import Settings

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Principal:
    """A tenant (`namespace` set) or an operator (`operator` set), never both."""

    namespace: str | None = None
    operator: str | None = None

    @property
    def is_ops(self) -> bool:
        return self.operator is not None

    def scope(self, namespace: str | None = None) -> str | None:
        """The namespace a read is limited to: a tenant's own, always; an
        operator's `namespace` filter, or None (every namespace)."""
        return namespace if self.is_ops else self.namespace


def _lookup(table: dict[str, str], token: str) -> str | None:
    # Constant-time comparison against every configured token.
    found = None
    for candidate, owner in table.items():
        if hmac.compare_digest(candidate.encode(), token.encode()):
            found = owner
    return found


def known_principal(settings: Settings, token: str) -> Principal | None:
    """The principal of a configured or recently seen token, without I/O
    (cheap enough for the event loop); None: ask `principal_for_token`."""
    token = token.strip()
    if not token:
        return None
    operator = _lookup(settings.ops_token_map, token)
    if operator is not None:
        return Principal(operator=operator)
    namespace = _lookup(settings.token_map, token) or _cached(token_hash(token))
    return Principal(namespace=namespace) if namespace is not None else None


def principal_for_token(settings: Settings, token: str) -> Principal | None:
    """The principal of `token`, or None when it is not a valid token."""
    known = known_principal(settings, token)
    if known is not None or not token.strip():
        return known
    digest = token_hash(token.strip())
    with transaction() as session:
        namespace = tokens_db.token_namespace(session, digest)
    if namespace is None:
        return None
    _remember(digest, namespace)
    return Principal(namespace=namespace)


# Tokens created with `signalbox-server token create` live in the database;
# a request should not cost a transaction to find its namespace. A known
# token is remembered for TOKEN_CACHE_SECONDS (unknown ones never are, so a
# new token works at once).
TOKEN_CACHE_SECONDS = 30.0
TOKEN_CACHE_ENTRIES = 1024
_tokens: OrderedDict[str, tuple[str, float]] = OrderedDict()
_tokens_lock = threading.Lock()


def _cached(digest: str) -> str | None:
    with _tokens_lock:
        entry = _tokens.get(digest)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]


def _remember(digest: str, namespace: str) -> None:
    with _tokens_lock:
        _tokens[digest] = (namespace, time.monotonic() + TOKEN_CACHE_SECONDS)
        _tokens.move_to_end(digest)
        while len(_tokens) > TOKEN_CACHE_ENTRIES:
            _tokens.popitem(last=False)


# ---------------------------------------------------------------- failures
#
# Failed sign-ins and unknown bearer tokens are counted per client address in
# a sliding window: the first FAILURES_PER_WINDOW of the last
# FAILURE_WINDOW_SECONDS are answered 401, the next ones 429 until the oldest
# counted failure leaves the window (a refused attempt is not counted, so
# Retry-After is when the next attempt is answered again). A valid token is
# resolved before any of this and is never refused.

FAILURES_PER_WINDOW = 20
FAILURE_WINDOW_SECONDS = 60.0
FAILURE_KEY_PREFIX = "signalbox:auth-failures:"
_MEMORY_ADDRESSES = 10_000

# One round trip, atomic across API replicas; Redis's clock, so replicas'
# clocks need not agree. Returns nil (counted) or the seconds until a slot frees.
_RECORD_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(tonumber(oldest[2]) + window - now)
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
return false
"""


class TooManyFailures(TooManyRequests):
    """This address failed to authenticate too often: 429 `too_many_failures`."""

    code = "too_many_failures"
    default_message = (
        f"More than {FAILURES_PER_WINDOW} failed sign-ins or unknown tokens from this"
        f" address in {FAILURE_WINDOW_SECONDS:.0f} seconds; retry after Retry-After seconds."
    )


def failure_record(settings: Settings, address: str) -> float | None:
    """Count one failed authentication from `address`. None: counted, answer
    401; a number: this address is out of attempts, answer 429 with this many
    seconds until one frees (this attempt is not counted).

    Shared through Redis when one is configured (every API replica and worker
    process sees the same count); if Redis cannot be reached, or without
    Redis, it is counted in this process."""
    url = redis_url(settings)
    if not is_redis_url(url):
        return _memory_record(address, time.monotonic())
    try:
        answer = client_for(url, timeout=READ_TIMEOUT_SECONDS).eval(
            _RECORD_SCRIPT,
            1,
            FAILURE_KEY_PREFIX + address,
            FAILURE_WINDOW_SECONDS,
            FAILURES_PER_WINDOW,
            secrets.token_hex(8),
        )
    except (RedisError, OSError):
        _log.warning("auth failure throttle: Redis unavailable, counted in this process")
        return _memory_record(address, time.monotonic())
    return None if answer is None else max(0.0, float(answer))


_failures: dict[str, deque[float]] = {}
_failures_lock = threading.Lock()


def _memory_record(address: str, now: float) -> float | None:
    with _failures_lock:
        times = _failures.pop(address, None) or deque()
        while times and times[0] <= now - FAILURE_WINDOW_SECONDS:
            times.popleft()
        _failures[address] = times  # re-inserted: the dict stays oldest-used first
        if len(times) >= FAILURES_PER_WINDOW:
            return times[0] + FAILURE_WINDOW_SECONDS - now
        times.append(now)
        while len(_failures) > _MEMORY_ADDRESSES:
            del _failures[next(iter(_failures))]
        return None


# ---------------------------------------------------------------- console sessions


def console_session_revoke(sid: str, expires: float) -> None:
    """Sign out console session `sid` on every API replica; its cookie
    would expire at `expires` (Unix seconds), and is refused until then."""
    with transaction() as session:
        console_sessions_db.console_session_revoke(
            session, sid, datetime.fromtimestamp(expires, UTC)
        )


def console_session_revoked(sid: str) -> bool:
    """Whether console session `sid` was signed out."""
    with transaction() as session:
        return console_sessions_db.console_session_is_revoked(session, sid)
