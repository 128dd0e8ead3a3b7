"""Structured logs: one JSON object a line, with content kept out; for a
person at a terminal, one readable line each instead (`SIGNALBOX_LOG_FORMAT`,
default `auto`: readable when the log stream is a TTY, JSON otherwise).

Log calls pass identifiers in `extra` (event, run_id, signal_id,
recipient_hash, ...). The formatter writes only the message, the level, the
logger and a fixed allow-list of extra keys, so a body, a link, a code, a
token or an address in clear cannot reach the logs through `extra`; exception
text is reduced to its type, because exception messages can quote input.

The message itself is scrubbed too, as a second line of defence for
third-party loggers (aiosmtpd, Celery, uvicorn) whose text we do not write:
an email address becomes `<addr:HASH>` (the keyed recipient hash of docs/api.md
"Evidence"; `<addr>` when this process has no key), an http(s) URL becomes
`<url>` (but a bare listening address such as `http://127.0.0.1:8040`, which
`Uvicorn running on …` names), a bearer token becomes `<token>`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import Any

from app.domain.ids import recipient_hash
from app.infra import keys

ALLOWED_EXTRA = frozenset(
    {
        "event",
        "run_id",
        "signal_id",
        "claim_id",
        "message_id",
        "dead_letter_id",
        "sink_message_id",
        "sink_message_ids",
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
        "deleted",
        "tables",
    }
)

# Loggers that may print addresses or request lines: warnings only.
QUIET_LOGGERS = (
    "uvicorn.access",
    "mail.log",
    "amqp",
    "kombu",
    "botocore",
    "tornado.access",
    "httpx",
    "httpcore",
)

# Local part starting with a letter or digit, domain ending in a letter TLD:
# `user+tag@example.test` matches, `redis://:**@127.0.0.1` and `celery@host` do not.
_ADDRESS = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]*@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b"
)
_URL = re.compile(r"https?://[^\s'\"<>]+", re.IGNORECASE)
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
# A server's own listening address (`Uvicorn running on http://127.0.0.1:8040`):
# an IP literal or localhost, a port, no path, query or credentials. It names
# no message and no token, so it is kept; every other URL is redacted.
_LISTEN_ORIGIN = re.compile(
    r"https?://(?:localhost|\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?/?",
    re.IGNORECASE,
)


def _url_or_origin(match: re.Match[str]) -> str:
    url = match.group(0)
    return url if _LISTEN_ORIGIN.fullmatch(url) else "<url>"


def _process_key() -> bytes | None:
    """This process's recipient-hash key, or None when it cannot be had (bad
    settings, an unwritable data directory): a log line is never lost for it."""
    try:
        return keys.recipient_hash_key()
    except Exception:
        return None


def scrub(text: str, key: bytes | None = None) -> str:
    """Replace addresses (by their recipient hash with ``key``, else this
    process's key), http(s) URLs (but a bare listening address) and bearer
    tokens in free text."""
    if "@" in text and _ADDRESS.search(text):
        hash_key = key if key is not None else _process_key()
        text = _ADDRESS.sub(
            lambda m: f"<addr:{recipient_hash(m.group(), hash_key)}>" if hash_key else "<addr>",
            text,
        )
    if "://" in text:
        text = _URL.sub(_url_or_origin, text)
    if "earer" in text:
        text = _BEARER.sub(r"\1<token>", text)
    return text


def _task_context() -> dict[str, str]:
    """The running Celery task's name and id, when this line is logged inside one."""
    celery_state = sys.modules.get("celery._state")
    if celery_state is None:
        return {}
    task = celery_state.get_current_task()
    request = getattr(task, "request", None) if task is not None else None
    task_id = getattr(request, "id", None) if request is not None else None
    if not task_id:
        return {}
    return {"task": str(task.name), "task_id": str(task_id)}


# Frames of an exception's traceback a log line names (innermost last).
EXC_FRAMES = 8


def exception_facts(error: BaseException | None) -> dict[str, Any]:
    """What a log line may say of an exception without its text (which can
    quote input): its type, the type and SQLSTATE of what it wraps (a
    driver's error: `53300` is "too many connections"), and where it was
    raised, as `file:line function` frames: enough to name a 500's cause."""
    if error is None:
        return {}
    facts: dict[str, Any] = {"exc_type": type(error).__name__}
    cause = getattr(error, "orig", None) or error.__cause__
    if cause is not None:
        facts["exc_cause"] = type(cause).__name__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str):
        facts["exc_sqlstate"] = sqlstate
    frames = traceback.extract_tb(error.__traceback__)
    # This project's frames (which route, which use case), then the
    # innermost few (where a library raised it).
    ours = [f for f in frames[:-2] if f"{os.sep}app{os.sep}" in f.filename]
    facts["exc_where"] = [
        f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
        for f in [*ours[-(EXC_FRAMES - 2) :], *frames[-2:]]
    ]
    return facts


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, component, pid, msg and allowed extras.

    Addresses in the message are hashed with ``hash_key``, by default this
    process's recipient-hash key."""

    def __init__(self, component: str, hash_key: bytes | None = None) -> None:
        super().__init__()
        self.component = component
        self.hash_key = hash_key

    def entry(self, record: logging.LogRecord) -> dict[str, Any]:
        """The line's fields: what is allowed out of `record`, scrubbed."""
        try:
            message = record.getMessage()
        except Exception:  # a bad %-format in a library must not lose the line
            message = str(record.msg)
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "component": self.component,
            "pid": record.process,
            "msg": scrub(message, self.hash_key),
        }
        entry.update(_task_context())
        for key in ALLOWED_EXTRA:
            if key in record.__dict__:
                entry[key] = record.__dict__[key]
        if record.exc_info and record.exc_info[0] is not None:
            entry.update(exception_facts(record.exc_info[1]))
        return entry

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self.entry(record), default=str)


# Fields a readable line shows in its fixed columns, not as key=value.
_COLUMNS = frozenset({"ts", "level", "logger", "component", "pid", "msg"})


class TextFormatter(JsonFormatter):
    """The same fields as `JsonFormatter`, as one line a person reads:
    ``13:45:43.952 INFO  worker   signalbox.checks  signal found  event=signal_found signal_id=…``.
    Multi-line messages (a library's warning) are joined with ` | `."""

    def format(self, record: logging.LogRecord) -> str:
        entry = self.entry(record)
        clock = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        message = " | ".join(part.strip() for part in str(entry["msg"]).splitlines() if part)
        extras = " ".join(f"{k}={entry[k]}" for k in sorted(entry) if k not in _COLUMNS)
        line = f"{clock} {record.levelname:<7} {self.component:<6} {record.name}: {message}"
        return f"{line}  {extras}" if extras else line


LOG_FORMATS = ("auto", "json", "text")


def formatter_for(component: str, stream: Any, log_format: str | None = None) -> JsonFormatter:
    """The formatter of `component`'s lines on `stream`: `text` (readable) or
    `json`, or for `auto` (the default, `SIGNALBOX_LOG_FORMAT`) readable
    exactly when `stream` is a terminal."""
    chosen = (log_format or os.environ.get("SIGNALBOX_LOG_FORMAT") or "auto").lower()
    if chosen == "auto":
        isatty = getattr(stream, "isatty", None)
        chosen = "text" if callable(isatty) and isatty() else "json"
    return TextFormatter(component) if chosen == "text" else JsonFormatter(component)


def failure_extra(event: str, exc: BaseException, **fields: Any) -> dict[str, Any]:
    """The `extra` of a line about a failure: `event`, `fields`, and the
    error named only by its type (its text may hold an address or a secret)."""
    return {"event": event, **fields, "error": type(exc).__name__}


def signal_extra(
    event: str, run_id: str, signal_id: str, recipient: str, **fields: Any
) -> dict[str, Any]:
    """The `extra` of a line about one signal: `event`, the signal's run and
    id, its recipient only as a hash (never the address), and `fields`."""
    return {
        "event": event,
        "run_id": run_id,
        "signal_id": signal_id,
        "recipient_hash": keys.recipient_hash(recipient),
        **fields,
    }


def refused_extra(reason: str, reply_code: int, recipient_hashes: list[str]) -> dict[str, Any]:
    """The `extra` of a refused SMTP delivery's line: why, the SMTP reply code
    sent (in the field `status_code`, the name every line of a code uses), and
    the recipients only as hashes."""
    return {
        "event": "smtp_refused",
        "reason": reason,
        "status_code": reply_code,
        "recipient_hashes": recipient_hashes,
    }


def warn_unreachable(
    logger: logging.Logger, message: str, event: str, component: str, exc: BaseException
) -> None:
    """Log that `component` did not answer, naming only the error's type."""
    logger.warning(message, extra=failure_extra(event, exc, component=component))


def configure_logging(
    component: str, level: str | None = None, log_format: str | None = None
) -> None:
    """Log lines on stderr for every logger of this process: JSON, or readable
    ones at a terminal (`formatter_for`)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_for(component, sys.stderr, log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or os.environ.get("SIGNALBOX_LOG_LEVEL") or "INFO").upper())
    # Library loggers that quote envelopes, request lines or URLs stay at
    # warning; the scrubbing above still covers what they print then.
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Warnings (DeprecationWarning from a library, ...) go through the JSON handler too.
    logging.captureWarnings(True)
