"""The `sink` provider: reads what the built-in SMTP sink stored in PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy.exc import SQLAlchemyError

from app.db import messages as messages_repo
from app.db.engine import transaction
from app.errors import ProviderUnavailable
from app.providers.base import ProviderMessage, SearchQuery


class SinkProvider:
    """`simulate_latency_seconds` slows every search: for fault drills (kill a
    worker mid-check) and demos, never needed in production."""

    type = "sink"

    def __init__(self, name: str = "sink", simulate_latency_seconds: float = 0.0) -> None:
        self.name = name
        self.latency = float(simulate_latency_seconds)

    def search(self, query: SearchQuery) -> Sequence[ProviderMessage]:
        if self.latency:
            time.sleep(self.latency)
        try:
            with transaction() as session:
                rows = messages_repo.sink_message_search(
                    session, since=query.since, recipients=sorted(query.recipients) or None
                )
        except SQLAlchemyError as exc:
            raise ProviderUnavailable(
                "sink storage unavailable", error_code="sink_unavailable"
            ) from exc
        return [
            ProviderMessage(
                provider_message_id=str(r["id"]),
                received_at=r["received_at"],
                raw=bytes(r["raw"]),
                envelope_recipients=tuple(r["envelope_recipients"]),
            )
            for r in rows
        ]

    def close(self) -> None:
        return None
