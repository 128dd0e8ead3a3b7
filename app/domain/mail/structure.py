"""The MIME structure of raw mail as byte offsets, read with linear scans.

Pure. :func:`scan` finds every part of a message (its headers, its content
type, where its body lies in the raw bytes) without building the stdlib's
MIME tree and without copying a body: a 25 MiB message with attachments costs
its raw bytes and a few hundred bytes per part. :func:`decoded_chunks` then
decodes one part's body from its transfer encoding chunk by chunk, so an
attachment is hashed or served without holding its decoded bytes whole.

Hostile structure is bounded: at most :data:`MAX_PARTS` parts (the rest is
left out and ``Structure.truncated`` says so), multiparts nested at most
:data:`MAX_DEPTH` deep, a part's header block read up to
:data:`MAX_PART_HEADER_BYTES` and :data:`MAX_PART_HEADERS` headers, a
boundary of at most 200 characters. Every scan is a regular expression or a
``find`` over the part's range, so the time is linear in the message's size
times its (bounded) depth. Nothing here raises on any input.
"""

from __future__ import annotations

import binascii
import dataclasses
import email.message
import email.policy
import email.utils
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.domain.mail.charset import clean_text, decode_raw_header

__all__ = [
    "MAX_DEPTH",
    "MAX_PARTS",
    "Part",
    "Structure",
    "decoded_chunks",
    "scan",
]

MAX_PARTS = 1000  # parts of any kind (multiparts included) read in one message
MAX_DEPTH = 16  # multiparts nested in multiparts
MAX_PART_HEADER_BYTES = 64 * 1024
MAX_PART_HEADERS = 1000
MAX_HEADER_VALUE = 16 * 1024  # one header's value, unfolded, as kept
_MAX_PARAM_HEADER = 4096  # Content-Type / -Disposition handed to the parameter parser
_MAX_BOUNDARY = 200
CHUNK_BYTES = 1024 * 1024

# One header line and its continuation lines, ending with its line break;
# possessive, so a failed match costs one pass over the header.
_HEADER_RE = re.compile(rb"([!-9;-~]++)[ \t]*+:([^\r\n]*+(?:\r?\n[ \t][^\r\n]*+)*+)(?:\r?\n|\Z)")
_FOLD_RE = re.compile(rb"\r?\n(?=[ \t])")
_BLANK_RE = re.compile(rb"\r?\n\r?\n")
_NOT_BASE64 = bytes(b for b in range(256) if not re.match(rb"[A-Za-z0-9+/=]", bytes([b])))
_TOKEN_TYPE_RE = re.compile(r"[a-z0-9!#$&^_.+-]{1,64}/[a-z0-9!#$&^_.+-]{1,64}")


@dataclass(frozen=True)
class Part:
    """One MIME part: where it is and what its headers say.

    ``section`` numbers it as IMAP does (``"1"`` for a single-part message's
    body, ``"2.1"`` for the first child of the second part). ``headers`` are
    (name, value) pairs in order, values unfolded and decoded (RFC 2047, 8-bit
    bytes) and cut to :data:`MAX_HEADER_VALUE`. ``content_type`` is the
    lower-cased ``type/subtype`` (``text/plain`` when missing or malformed,
    ``message/rfc822`` in a ``multipart/digest``); ``body_start``/``body_end``
    are offsets into the raw message; ``leaf`` is False for a multipart whose
    children were read.
    """

    section: str
    headers: tuple[tuple[str, str], ...]
    # The same values as sent (unfolded, 8-bit bytes as surrogate escapes):
    # address lists are split before their display names are decoded.
    raw_values: tuple[str, ...]
    content_type: str
    charset: str | None
    disposition: str | None
    filename: str | None
    content_id: str | None
    encoding: str
    body_start: int
    body_end: int
    depth: int
    leaf: bool


@dataclass(frozen=True)
class Structure:
    """Every part of a message in document order; ``truncated`` when a bound
    left parts out (more than :data:`MAX_PARTS`, or nested too deep)."""

    parts: tuple[Part, ...]
    truncated: bool

    @property
    def root(self) -> Part:
        return self.parts[0]

    @property
    def leaves(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.leaf)


def scan(raw: bytes) -> Structure:
    """The parts of ``raw``, root first, in document order. Never raises."""
    try:
        return _scan(raw)
    except Exception:  # a last resort: the promise is "never a crash"
        part = _part(raw, "1", 0, len(raw), 0, "text/plain")
        return Structure((part,), True)


def _scan(raw: bytes) -> Structure:
    parts: list[Part] = []
    truncated = False
    # (start, end, section, depth, default content type), depth first in document order.
    todo: list[tuple[int, int, str, int, str]] = [(0, len(raw), "", 0, "text/plain")]
    while todo:
        start, end, section, depth, default = todo.pop()
        if len(parts) >= MAX_PARTS:
            truncated = True
            break
        part = _part(raw, section or "1", start, end, depth, default)
        boundary = _boundary(part) if part.content_type.startswith("multipart/") else None
        if boundary is None or depth >= MAX_DEPTH:
            truncated = truncated or boundary is not None
            parts.append(part)
            continue
        children = _split(raw, part.body_start, part.body_end, boundary, MAX_PARTS - len(parts))
        if children is None:  # no delimiter at all: the stdlib keeps it as one opaque body
            parts.append(part)
            continue
        ranges, cut = children
        truncated = truncated or cut
        parts.append(dataclasses.replace(part, leaf=False))
        child_default = (
            "message/rfc822" if part.content_type == "multipart/digest" else "text/plain"
        )
        prefix = f"{section}." if section else ""
        for index in range(len(ranges) - 1, -1, -1):
            a, b = ranges[index]
            todo.append((a, b, f"{prefix}{index + 1}", depth + 1, child_default))
    return Structure(tuple(parts), truncated)


def _split(
    raw: bytes, start: int, end: int, boundary: bytes, room: int
) -> tuple[list[tuple[int, int]], bool] | None:
    """The byte ranges of a multipart's children (at most ``room``), and
    whether some were left out; None when no delimiter is there."""
    delimiter = re.compile(rb"(?m)^--" + re.escape(boundary) + rb"(--)?[ \t]*+\r?$")
    ranges: list[tuple[int, int]] = []
    opened: int | None = None
    seen = False
    for match in delimiter.finditer(raw, start, end):
        seen = True
        if opened is not None:
            ranges.append((opened, _before_line_break(raw, opened, match.start())))
            if len(ranges) >= room:
                return ranges, True
        if match.group(1):  # the closing delimiter: the rest is the epilogue
            opened = None
            break
        opened = _after_line(raw, match.end(), end)
    if not seen:
        return None
    if opened is not None:  # no closing delimiter: the last part runs to the end
        ranges.append((opened, end))
    return ranges, False


def _before_line_break(raw: bytes, floor: int, pos: int) -> int:
    """``pos`` less the line break before it (it belongs to the delimiter)."""
    if pos > floor and raw[pos - 1 : pos] == b"\n":
        pos -= 1
        if pos > floor and raw[pos - 1 : pos] == b"\r":
            pos -= 1
    return pos


def _after_line(raw: bytes, pos: int, end: int) -> int:
    """The offset after the line break at ``pos`` (or ``end``)."""
    if raw[pos : pos + 2] == b"\r\n":
        return pos + 2
    if raw[pos : pos + 1] == b"\n":
        return pos + 1
    return min(pos, end)


def _part(raw: bytes, section: str, start: int, end: int, depth: int, default: str) -> Part:
    pairs, body_start = _read_headers(raw, start, end)
    headers = tuple((name, _decoded(value)) for name, value in pairs)
    meta = _meta(pairs, default)
    return Part(
        section=section,
        headers=headers,
        raw_values=tuple(v.decode("utf-8", "surrogateescape") for _, v in pairs),
        body_start=body_start,
        body_end=max(body_start, end),
        depth=depth,
        leaf=True,
        **meta,
    )


def _read_headers(raw: bytes, start: int, end: int) -> tuple[list[tuple[str, bytes]], int]:
    """The header lines at ``start`` (name, raw unfolded value) and where the
    body starts: after the blank line, or at the first line that is not a
    header (as the stdlib reads a part without a separator)."""
    pairs: list[tuple[str, bytes]] = []
    pos = start
    limit = min(end, start + MAX_PART_HEADER_BYTES)
    while pos < end:
        if raw.startswith(b"\r\n", pos) or raw.startswith(b"\n", pos):
            return pairs, _after_line(raw, pos, end)
        if len(pairs) >= MAX_PART_HEADERS or pos >= limit:
            # Too many or too long: the rest of the block is skipped, but for
            # the first of each MIME header (the structure depends on them).
            blank = _BLANK_RE.search(raw, pos, end)
            body_start = blank.end() if blank else end
            return pairs + _mime_headers_after(raw, pairs, pos, body_start), body_start
        match = _HEADER_RE.match(raw, pos, end)
        if match is None:
            return pairs, pos
        kept = raw[match.start(2) : min(match.end(2), match.start(2) + 2 * MAX_HEADER_VALUE)]
        value = _FOLD_RE.sub(b"", kept)
        pairs.append((match.group(1).decode("ascii"), value.strip()[:MAX_HEADER_VALUE]))
        pos = match.end()
    return pairs, end


_MIME_HEADER_RE = re.compile(rb"(?im)^(content-(?:type|transfer-encoding|disposition|id))[ \t]*+:")


def _mime_headers_after(
    raw: bytes, pairs: list[tuple[str, bytes]], pos: int, end: int
) -> list[tuple[str, bytes]]:
    seen = {name.lower() for name, _ in pairs}
    found: list[tuple[str, bytes]] = []
    for match in _MIME_HEADER_RE.finditer(raw, pos, end):
        name = match.group(1).decode("ascii")
        if name.lower() in seen:
            continue
        header = _HEADER_RE.match(raw, match.start(), end)
        if header is None:
            continue
        seen.add(name.lower())
        kept = raw[header.start(2) : min(header.end(2), header.start(2) + 2 * MAX_HEADER_VALUE)]
        found.append((name, _FOLD_RE.sub(b"", kept).strip()[:MAX_HEADER_VALUE]))
    return found


def _decoded(value: bytes) -> str:
    """A raw header value as text: 8-bit bytes and RFC 2047 encoded words decoded."""
    text = value.decode("utf-8", "surrogateescape")
    try:
        return clean_text(decode_raw_header(text) if "=?" in text else text)
    except Exception:
        return clean_text(text)


def _meta(pairs: list[tuple[str, bytes]], default: str) -> dict[str, Any]:
    """Content type, charset, disposition, filename, content id and transfer
    encoding, read by the stdlib's parameter parser (RFC 2231 included) from
    these headers alone (the first of each, cut to a safe length)."""
    wanted = ("content-type", "content-disposition", "content-id", "content-transfer-encoding")
    msg = email.message.Message(policy=email.policy.compat32)
    for name, value in pairs:
        key = name.lower()
        if key in wanted and key not in msg:
            msg[name] = value[:_MAX_PARAM_HEADER].decode("utf-8", "surrogateescape")
    msg.set_default_type(default)
    content_type = _safe_str(msg.get_content_type) or default
    if not _TOKEN_TYPE_RE.fullmatch(content_type):
        content_type = "application/octet-stream"
    disposition = _safe_str(msg.get_content_disposition)
    filename = _safe_str(msg.get_filename) or _safe_str(lambda: msg.get_param("name"))
    if filename:
        filename = _decoded(filename.encode("utf-8", "surrogateescape")) or None
    content_id = _safe_str(lambda: msg.get("content-id"))
    if content_id:
        content_id = clean_text(content_id).strip().strip("<>").strip() or None
    encoding = (_safe_str(lambda: msg.get("content-transfer-encoding")) or "7bit").strip().lower()
    return {
        "content_type": content_type,
        "charset": _safe_str(msg.get_content_charset),
        "disposition": disposition.lower() if disposition else None,
        "filename": filename,
        "content_id": content_id,
        "encoding": encoding,
    }


def _safe_str(fn: object) -> str | None:
    try:
        value = fn()  # type: ignore[operator]
    except Exception:
        return None
    if isinstance(value, tuple):  # an RFC 2231 value the stdlib left undecoded
        value = email.utils.collapse_rfc2231_value(value)
    return value if isinstance(value, str) and value else None


def _boundary(part: Part) -> bytes | None:
    for name, value in part.headers:
        if name.lower() != "content-type":
            continue
        msg = email.message.Message(policy=email.policy.compat32)
        msg["Content-Type"] = value[:_MAX_PARAM_HEADER]
        found = _safe_str(msg.get_boundary)
        if not found or len(found) > _MAX_BOUNDARY:
            return None
        return found.rstrip().encode("utf-8", "surrogateescape")
    return None


def decoded_chunks(raw: bytes, part: Part) -> Iterator[bytes]:
    """A part's body decoded from its transfer encoding, in chunks of about
    :data:`CHUNK_BYTES`: base64 and quoted-printable are decoded (tolerantly,
    as the stdlib does: characters outside the alphabet skipped, data after
    the padding ignored, a missing padding supplied); anything else (7bit,
    8bit, binary, an unknown encoding) comes back as sent."""
    start, end = part.body_start, part.body_end
    if part.encoding == "base64":
        yield from _base64_chunks(raw, start, end)
    elif part.encoding == "quoted-printable":
        yield from _qp_chunks(raw, start, end)
    else:
        for pos in range(start, end, CHUNK_BYTES):
            yield raw[pos : min(end, pos + CHUNK_BYTES)]


def _base64_chunks(raw: bytes, start: int, end: int) -> Iterator[bytes]:
    carry = b""
    for pos in range(start, end, CHUNK_BYTES):
        data = carry + raw[pos : min(end, pos + CHUNK_BYTES)].translate(None, _NOT_BASE64)
        padding = data.find(b"=")
        if padding >= 0:
            yield _base64_last(data[:padding])
            return
        whole = len(data) - len(data) % 4
        if whole:
            yield binascii.a2b_base64(data[:whole])
        carry = data[whole:]
    if carry:
        yield _base64_last(carry)


def _base64_last(data: bytes) -> bytes:
    """The last quantum: a lone sixth of a byte dropped, missing padding added."""
    rest = len(data) % 4
    if rest == 1:
        data = data[:-1]
    elif rest:
        data += b"=" * (4 - rest)
    return binascii.a2b_base64(data) if data else b""


def _qp_chunks(raw: bytes, start: int, end: int) -> Iterator[bytes]:
    """Quoted-printable, cut at line ends so no soft line break or escape is split."""
    pos = start
    while pos < end:
        stop = min(end, pos + CHUNK_BYTES)
        if stop < end:
            line_end = raw.rfind(b"\n", pos, stop)
            stop = line_end + 1 if line_end >= pos else stop
        yield binascii.a2b_qp(raw[pos:stop])
        pos = stop
