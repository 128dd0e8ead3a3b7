"""The sink opens, before its first mail, every connection that mail's push
would otherwise wait for: one in each database pool (the store's and the
push's, and the one a check writes its answer in) and the breakers' Redis
connection."""

from __future__ import annotations

import pytest

from app.db.engine import _autocommit_companion, get_engine
from app.infra import redis as redis_module
from app.settings import get_settings
from app.usecases import intake

pytestmark = pytest.mark.integration


def test_warm_opens_both_database_pools_and_the_breakers_redis(
    in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_module, "_clients", {})  # this process's clients, made anew
    engine = get_engine()
    pools = (engine.pool, _autocommit_companion(engine).pool)
    redis_pool = redis_module.redis_client().connection_pool
    assert [p.checkedin() for p in pools] == [0, 0]  # nothing open yet
    assert len(redis_pool._available_connections) == 0

    intake.warm(get_settings())

    assert [p.checkedin() for p in pools] == [1, 1]
    assert len(redis_pool._available_connections) == 1
