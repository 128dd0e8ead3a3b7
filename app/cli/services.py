"""The PostgreSQL and Redis a command runs on: the configured ones, or
embedded ones started for what is not configured."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from app.cli.ports import port_free
from app.errors import ConfigurationError
from app.settings import Settings, get_settings

if TYPE_CHECKING:
    from app.infra.embedded import EmbeddedServices


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def resolve_services(settings: Settings) -> tuple[Settings, EmbeddedServices | None]:
    """Start embedded PostgreSQL/Redis for what is not configured, export the
    URLs to the environment (children inherit them), return fresh settings.

    Redis is needed even with another broker (RabbitMQ): the circuit breaker
    keeps its state there. Without SIGNALBOX_REDIS_URL it is the broker when
    that is Redis, else the embedded one.
    """
    from app.infra.embedded import embedded_redis_url, ensure_services

    broker = settings.broker_url
    redis_url = settings.redis_url or (broker if broker and broker.startswith("redis") else None)
    embedded_redis = embedded_redis_url(settings.data_dir, settings.embedded_redis_port)
    if not redis_url and embedded_redis and _redis_answers(embedded_redis):
        redis_url = embedded_redis  # `up` already runs it: share it
    if not redis_url and not port_free("127.0.0.1", settings.embedded_redis_port):
        raise ConfigurationError(
            f"port {settings.embedded_redis_port} on 127.0.0.1 is taken by something other than"
            " this data directory's Redis: set SIGNALBOX_EMBEDDED_REDIS_PORT to a free port,"
            " or SIGNALBOX_REDIS_URL to a Redis to use"
        )
    handles = None
    database_url = settings.database_url
    if not database_url or not redis_url:
        handles = ensure_services(
            database_url=database_url,
            broker_url=redis_url,
            data_dir=settings.data_dir,
            redis_port=settings.embedded_redis_port,
        )
        database_url, redis_url = handles.database_url, handles.redis_url
    os.environ["SIGNALBOX_DATABASE_URL"] = database_url or ""
    os.environ["SIGNALBOX_BROKER_URL"] = broker or redis_url or ""
    os.environ["SIGNALBOX_REDIS_URL"] = redis_url or ""
    get_settings.cache_clear()
    return get_settings(), handles
