"""What the gauges of `/metrics` describe, read at scrape time from their
source of truth: signals and dead letters from PostgreSQL, the providers'
circuit breakers from Redis. `app.observability.exposition` formats them."""

from __future__ import annotations

from dataclasses import dataclass

from app.db import dead_letters as dead_letters_db
from app.db import due as due_db
from app.db import server as server_db
from app.db import signals as signals_db
from app.db.engine import transaction
from app.infra.redis import READ_TIMEOUT_SECONDS, client_for, is_redis_url, redis_url
from app.providers.breaker import snapshot_all
from app.providers.runtime import provider_configs
from app.settings import Settings


@dataclass(frozen=True)
class StoredState:
    """Signals by status, the oldest due check's age in seconds, dead letters
    by (reason, state, namespace), and the age of the database's oldest open
    transaction in seconds."""

    signals_by_status: dict[str, int]
    oldest_due_seconds: float
    dead_letters: dict[tuple[str, str, str], int]
    oldest_transaction_seconds: float


def stored_state() -> StoredState:
    """Read in one transaction; a database that does not answer raises."""
    with transaction() as session:
        return StoredState(
            signals_by_status=signals_db.signal_count_by_status(session),
            oldest_due_seconds=due_db.signal_oldest_due_age(session),
            dead_letters=dead_letters_db.dead_letter_count_by_reason_state_namespace(session),
            oldest_transaction_seconds=server_db.db_oldest_transaction_age(session),
        )


def circuit_states(settings: Settings) -> dict[str, str] | None:
    """Each provider's breaker state as Redis holds it (a provider never seen
    is absent); None when the breakers are not kept in Redis. A Redis that
    does not answer raises."""
    url = redis_url(settings)
    if not is_redis_url(url):
        return None
    return snapshot_all(client_for(url, timeout=READ_TIMEOUT_SECONDS))


def configured_providers(settings: Settings) -> list[str]:
    """The names of this deployment's providers (`sink` alone when the
    providers file cannot be read: that is reported at start-up, not here)."""
    try:
        return list(provider_configs(settings))
    except Exception:  # a broken providers file is reported at start-up, not here
        return ["sink"]
