"""The `sink` provider: reads what the built-in SMTP sink stored in PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from app.db import sink_messages as sink_messages_db
from app.db.engine import autocommit
from app.errors import ProviderUnavailable
from app.providers.base import ProviderMessage, SearchQuery

# Rows per page when reading a window: a busy address is read whole, page by page.
PAGE_SIZE = 500
# Messages just before a window are only worth reporting as near misses: the
# latest few per recipient are enough.
BEFORE_WINDOW_PER_RECIPIENT = 20


class SinkProvider:
    """`simulate_latency_seconds` slows every search: for fault drills (kill a
    worker mid-check) and demos, never needed in production."""

    type = "sink"
    # The sink stamps arrival with the database's clock, to the microsecond.
    timestamp_precision = timedelta(0)
    # Every SMTP delivery pushes a check of its recipients' signals.
    pushes = True

    def __init__(self, name: str = "sink", simulate_latency_seconds: float = 0.0) -> None:
        self.name = name
        self.latency = float(simulate_latency_seconds)

    @property
    def plain(self) -> bool:
        """Its search is the query on `sink_messages` and nothing more (no
        simulated latency): a first look that finds nothing may be made in
        one statement (`app.usecases.checks.first`)."""
        return not self.latency

    def search(self, query: SearchQuery) -> Sequence[ProviderMessage]:
        """Every message to each recipient at or after its window (paged, so a
        busy address hides nothing), plus the latest few just before it;
        each without its raw bytes (`ProviderMessage.raw` None, `size` set)."""
        if self.latency:
            time.sleep(self.latency)
        windows = sorted((query.windows or {r: query.since for r in query.recipients}).items())
        if not windows:
            return []
        lookback = max(0.0, (min(t for _, t in windows) - query.since).total_seconds())
        rows: dict[int, Any] = {}
        try:
            with autocommit() as session:  # reads only: no BEGIN, no COMMIT
                before: Sequence[Any] = ()
                after: tuple[datetime, int] | None = None
                while True:
                    if after is None and lookback:  # the first page and the mail just before
                        page, before = sink_messages_db.sink_message_first_page(
                            session,
                            windows=windows,
                            limit=PAGE_SIZE,
                            lookback_seconds=lookback,
                            per_recipient=BEFORE_WINDOW_PER_RECIPIENT,
                            recorded_by=self.name,
                        )
                    else:
                        page = sink_messages_db.sink_message_page(
                            session,
                            windows=windows,
                            after=after,
                            limit=PAGE_SIZE,
                            recorded_by=self.name,
                        )
                    for r in page:
                        rows[int(r["id"])] = r
                    if len(page) < PAGE_SIZE:
                        break
                    after = (page[-1]["received_at"], int(page[-1]["id"]))
                for r in before:
                    rows.setdefault(int(r["id"]), r)
        except SQLAlchemyError as exc:
            raise ProviderUnavailable(
                "sink storage unavailable", error_code="sink_unavailable"
            ) from exc
        # No raw bytes: the window's rows carry their size, and the look
        # reads the bytes of the messages it must parse, a few at a time.
        found = [
            ProviderMessage(
                provider_message_id=str(r["id"]),
                received_at=r["received_at"],
                raw=None,
                envelope_recipients=tuple(r["envelope_recipients"]),
                recorded_known=True,
                recorded_id=r["recorded_id"],
                size=int(r["size"]),
                auth_namespace=r["auth_namespace"],
                message_id=r["message_id"],
            )
            for r in rows.values()
        ]
        found.sort(key=lambda m: (m.received_at, int(m.provider_message_id)))
        return found

    def close(self) -> None:
        return None
