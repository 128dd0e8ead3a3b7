"""Structured logs: one JSON object a line, with content kept out.

Log calls pass identifiers in `extra` (event, run_id, signal_id,
recipient_hash, ...). The formatter writes only the message, the level, the
logger and a fixed allow-list of extra keys, so a body, a link, a code, a
token or an address in clear cannot reach the logs through `extra`; exception
text is reduced to its type, because exception messages can quote input.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

ALLOWED_EXTRA = frozenset(
    {
        "event",
        "run_id",
        "signal_id",
        "claim_id",
        "message_id",
        "dead_letter_id",
        "sink_message_id",
        "recipient_hash",
        "recipient_hashes",
        "provider",
        "reason",
        "outcome",
        "error",
        "error_code",
        "size",
        "defects",
        "count",
        "state",
        "component",
        "namespace",
        "duration_ms",
        "status_code",
        "method",
        "path",
        "task",
        "task_id",
    }
)


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "component": self.component,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        for key in ALLOWED_EXTRA:
            if key in record.__dict__:
                entry[key] = record.__dict__[key]
        if record.exc_info and record.exc_info[0] is not None:
            entry["exc_type"] = record.exc_info[0].__name__
        return json.dumps(entry, default=str)


def configure_logging(component: str, level: str | None = None) -> None:
    """JSON lines on stderr for every logger of this process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(component))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or os.environ.get("SIGNALBOX_LOG_LEVEL") or "INFO").upper())
    # Access logs and library chatter stay at warning: they can carry URLs with ids only,
    # but a quieter default keeps incidents readable.
    for noisy in ("uvicorn.access", "mail.log", "amqp", "kombu", "botocore", "tornado.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
