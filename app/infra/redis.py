"""The one Redis client module: the circuit breaker, the bulkhead, first-look
tickets, the metrics' and the console's breaker states all get their client here.

Clients are cached per process id (a client is never shared across a fork)
and per URL and timeout.
"""

from __future__ import annotations

import os
import threading

from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from app.settings import Settings, get_settings

# The workers' calls (breaker, bulkhead, tickets) wait up to 2 s; a scrape or
# a console page reading breaker states waits 1 s and shows "unavailable".
DEFAULT_TIMEOUT_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 1.0

_lock = threading.Lock()
_clients: dict[tuple[int, str, float], Redis] = {}


def redis_url(settings: Settings) -> str:
    """The Redis the workers share: SIGNALBOX_REDIS_URL, else the broker's."""
    return settings.redis_url or settings.broker_url or ""


def is_redis_url(url: str | None) -> bool:
    """Whether `url` names a Redis server (the broker may be RabbitMQ)."""
    return bool(url) and str(url).startswith(("redis://", "rediss://", "unix://"))


def client_for(url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Redis:
    """This process's client of `url`."""
    key = (os.getpid(), url, timeout)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
            _clients[key] = client
        return client


def async_client(url: str, *, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> AsyncRedis:
    """A new asyncio client of `url`, for the one event loop that uses it;
    its owner closes it there (`await client.aclose()`)."""
    return AsyncRedis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def redis_client() -> Redis:
    """This process's client of the Redis shared by the workers (breaker,
    bulkhead, first-look tickets)."""
    return client_for(redis_url(get_settings()))
