"""``parse_mail``: bound the raw bytes, parse them on a CPU budget, never raise."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from contextlib import AbstractContextManager, nullcontext

from app.domain.mail.addresses import bare_address, fallback_addresses
from app.domain.mail.bounds import (
    ESSENTIAL_HEADERS,
    LOGICAL_HEADER_RE,
    MAX_HEADER_BYTES,
    BoundedView,
    ParseTimeout,
    bound_view,
    split_header_block,
)
from app.domain.mail.charset import (
    clean_text,
    decode_bytes,
    decode_raw_header,
    normalize_whitespace,
)
from app.domain.mail.mime import MimeParser
from app.domain.mail.observers import report_bounds
from app.domain.mail.parsed import BOUND_DEFECT_PREFIX, ParsedMail

PARSE_TIME_BUDGET_SECONDS = 3.0


def parse_mail(raw: bytes, *, budget: AbstractContextManager[object] | None = None) -> ParsedMail:
    """Parse raw RFC 5322 bytes into a :class:`ParsedMail`; never raises.

    The bytes are first cut to the bounds (:func:`bound_view`); a parse that
    ``budget`` interrupts with :class:`ParseTimeout` (the caller's CPU-time
    budget, ``app.infra.parse_budget``; ``None`` for none) gives the headers
    read by a linear fallback and ``BoundExceeded:time``.

    Headers are read with the modern ``email.policy.default`` parser and,
    where it raises on a malformed header, again from the raw header text.
    Body parts are decoded from their transfer encoding (quoted-printable,
    base64, 8bit) and then from their declared charset, falling back to
    UTF-8 and Windows-1252 when the charset is missing, unknown or wrong.
    """
    data = bytes(raw)
    try:
        view = bound_view(data)
    except Exception:  # the scans are plain regex work; this is only a last resort
        view = BoundedView(data[:MAX_HEADER_BYTES], ("header_bytes",))
    try:
        with nullcontext() if budget is None else budget:
            mail = _parse_view(view)
    except ParseTimeout:
        mail = _headers_only(view, "time")
    report_bounds(mail.defects)
    return mail


def _parse_view(view: BoundedView) -> ParsedMail:
    bounds = tuple(BOUND_DEFECT_PREFIX + b for b in view.bounds)
    try:
        mail = MimeParser(view.raw).parse()
    except Exception as exc:  # last resort: the promise is "never a crash"
        text = clean_text(decode_bytes(view.raw, None, []))
        mail = ParsedMail(
            subject="",
            to=(),
            cc=(),
            from_addr=None,
            message_id_header=None,
            run_marker=None,
            text=text,
            html="",
            defects=(f"UnparseableMessageDefect:{type(exc).__name__}",),
        )
    if not bounds:
        return mail
    return dataclasses.replace(mail, defects=tuple(dict.fromkeys(bounds + mail.defects)))


def _headers_only(view: BoundedView, bound: str) -> ParsedMail:
    """What a linear scan of the (bounded) header block gives, for a parse that
    ran out of time: the headers matching needs, no body."""
    head = split_header_block(view.raw)[0]
    values: dict[str, str] = {}
    for match in LOGICAL_HEADER_RE.finditer(head):
        name, _, value = match.group().partition(b":")
        key = name.strip().lower().decode("latin-1")
        if key in ESSENTIAL_HEADERS and key not in values:
            unfolded = re.sub(rb"\r?\n(?=[ \t])", b"", value).strip()
            values[key] = clean_text(unfolded.decode("utf-8", "surrogateescape"))

    def addresses(key: str) -> tuple[str, ...]:
        found = fallback_addresses([values[key]]) if key in values else []
        return tuple(dict.fromkeys(a for a in map(bare_address, found) if a))

    def single(key: str) -> str | None:
        text = normalize_whitespace(decode_raw_header(values.get(key, "")))
        return text or None

    senders = addresses("from")
    run_marker = single("x-signalbox-run") or single("x-run-id")
    bounds = (*view.bounds, bound)
    return ParsedMail(
        subject=unicodedata.normalize("NFC", single("subject") or ""),
        to=addresses("to"),
        cc=addresses("cc"),
        from_addr=senders[0] if senders else None,
        message_id_header=single("message-id"),
        run_marker=run_marker,
        text="",
        html="",
        defects=tuple(dict.fromkeys(BOUND_DEFECT_PREFIX + b for b in bounds)),
    )
