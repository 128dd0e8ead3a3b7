"""Per-process bounds on work the API holds open: concurrent long polls."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from app.errors import TooManyLongPolls


class LongPollGate:
    """At most `limit` long polls at once in this process.

    Used from the event loop only (no await between test and increment), so a
    plain counter is exact.
    """

    def __init__(self, limit: int, retry_after_seconds: float = 5.0) -> None:
        self.limit = limit
        self.retry_after_seconds = retry_after_seconds
        self.active = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        if self.active >= self.limit:
            raise TooManyLongPolls(
                f"this API process already holds {self.limit} long polls"
                " (SIGNALBOX_MAX_LONG_POLLS); retry, or poll without wait",
                retry_after_seconds=self.retry_after_seconds,
            )
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
