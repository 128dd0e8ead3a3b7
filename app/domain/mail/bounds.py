"""Bounds on raw mail, checked before the stdlib parser builds anything.

Pure: the CPU-time budget that interrupts a parse with :class:`ParseTimeout`
is armed by the caller (``app.infra.parse_budget``). See ``app.domain.mail``
for why: the stdlib builds the whole MIME tree first, and parts of it are
superlinear, so the raw bytes are cut to these bounds with linear scans first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ESSENTIAL_HEADERS",
    "LOGICAL_HEADER_RE",
    "MAX_BODY_LINES",
    "MAX_DEPTH",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_LENGTH",
    "MAX_HEADER_LINES",
    "MAX_MULTIPARTS",
    "MAX_PARTS",
    "BoundedView",
    "ParseTimeout",
    "bound_view",
    "split_header_block",
]

# Bounds checked on the raw bytes before the stdlib parser sees them (see the
# module docstring). Real mail stays far below each: a few KiB of headers,
# subjects under 1 KiB, a dozen parts nested three deep.
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_LINES = 1000
MAX_HEADER_LENGTH = 16 * 1024  # one header, unfolded (name included)
MAX_PARTS = 100  # MIME part delimiters in the whole message
MAX_DEPTH = 16  # multiparts nested in multiparts
MAX_MULTIPARTS = 64  # multipart containers (boundary declarations)
MAX_BODY_LINES = 100_000  # the stdlib spends about a microsecond per body line


@dataclass(frozen=True)
class BoundedView:
    """The bytes the stdlib parser may see, and the bounds that cut them."""

    raw: bytes
    bounds: tuple[str, ...] = ()


# Headers matching needs, kept even when the header block is cut before them.
ESSENTIAL_HEADERS = (
    "subject", "to", "cc", "from", "message-id", "x-signalbox-run", "x-run-id",
    "mime-version", "content-type", "content-transfer-encoding", "content-disposition",
)  # fmt: skip
# One logical header: a line that does not start with white space, then its
# continuation lines. Possessive, so the scan is linear.
LOGICAL_HEADER_RE = re.compile(rb"(?m)^[^ \t\r\n][^\r\n]*+(?:\r?\n[ \t][^\r\n]*+)*+")
# Run on a lower-cased copy (a literal prefix keeps the search fast); the value
# is then read from the original bytes at the same offsets.
_BOUNDARY_DECL_RE = re.compile(rb"""boundary[ \t]*=[ \t]*(?:"([^"\r\n]*)"|([^\s;"]+))""")
_NTH_LINE_RE = re.compile(rb"(?:[^\n]*+\n){%d}" % MAX_BODY_LINES)


def bound_view(raw: bytes) -> BoundedView:
    """Cut ``raw`` to the bounds, with linear scans that build no MIME tree.

    Within the bounds the bytes come back unchanged. Beyond them: a header
    block over ``MAX_HEADER_BYTES`` / ``MAX_HEADER_LINES`` keeps its first
    headers up to the bound plus the first occurrence of each header matching
    needs (Subject, To, Cc, From, the run marker, the MIME headers); a header
    over ``MAX_HEADER_LENGTH`` is cut there; the body is cut before the part
    delimiter past ``MAX_PARTS`` or the multipart past ``MAX_DEPTH`` levels
    (or past ``MAX_MULTIPARTS`` in all), so the stdlib sees a truncated
    multipart and keeps the parts before the cut.
    """
    head, sep, body = split_header_block(raw)
    hit: list[str] = []
    head = _bound_headers(head, hit)
    if body.count(b"\n") > MAX_BODY_LINES:
        nth = _NTH_LINE_RE.match(body)
        body = body[: nth.end()] if nth else body
        hit.append("body_lines")
    body = _bound_body(head, body, hit)
    if not hit:
        return BoundedView(raw)
    return BoundedView(head + (sep or b"\r\n\r\n") + body, tuple(dict.fromkeys(hit)))


def split_header_block(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """(header block, the blank line after it, body); no blank line: all header."""
    ends = [(i, n) for i, n in ((raw.find(b"\n\r\n"), 3), (raw.find(b"\n\n"), 2)) if i >= 0]
    if not ends:
        return raw, b"", b""
    index, length = min(ends)
    start = index - 1 if index > 0 and raw[index - 1 : index] == b"\r" else index
    return raw[:start], raw[start : index + length], raw[index + length :]


def _bound_headers(head: bytes, hit: list[str]) -> bytes:
    too_big = len(head) > MAX_HEADER_BYTES
    too_many = head.count(b"\n") + 1 > MAX_HEADER_LINES
    if not too_big and not too_many and len(head) <= MAX_HEADER_LENGTH:
        return head
    newline = b"\r\n" if b"\r\n" in head else b"\n"
    kept: list[bytes] = []
    names: set[bytes] = set()
    size = lines = 0
    cut_any = False
    for match in LOGICAL_HEADER_RE.finditer(head):
        header = match.group()
        if len(header) > MAX_HEADER_LENGTH:
            header = _cut_header(header)
            cut_any = True
        header_lines = header.count(b"\n") + 1
        if size + len(header) > MAX_HEADER_BYTES or lines + header_lines > MAX_HEADER_LINES:
            break
        kept.append(header)
        names.add(_header_name(header))
        size += len(header) + len(newline)
        lines += header_lines
    else:
        if cut_any:
            hit.append("header_length")
        return newline.join(kept)
    hit.append("header_bytes" if too_big else "header_lines")
    if cut_any:
        hit.append("header_length")
    # The block was cut: still keep the first of each header matching needs.
    lowered = b"\n" + head.lower()
    for name in ESSENTIAL_HEADERS:
        if name.encode() in names:
            continue
        found = re.search(rb"\n" + re.escape(name.encode()) + rb"[ \t]*:", lowered)
        if found is None:
            continue
        whole = LOGICAL_HEADER_RE.match(head, found.start())
        if whole is None:
            continue
        header = whole.group()
        if len(header) > MAX_HEADER_LENGTH:
            header = _cut_header(header)
            hit.append("header_length")
        kept.append(header)
    return newline.join(kept)


def _header_name(header: bytes) -> bytes:
    return header.split(b":", 1)[0].strip().lower()


def _cut_header(header: bytes) -> bytes:
    """A header cut to ``MAX_HEADER_LENGTH``, at a line break or space when one is near."""
    cut = header[:MAX_HEADER_LENGTH]
    space = max(cut.rfind(b" "), cut.rfind(b"\t"), cut.rfind(b"\n"))
    if space > MAX_HEADER_LENGTH // 2:
        cut = cut[:space]
    return cut.rstrip(b" \t\r\n")


def _bound_body(head: bytes, body: bytes, hit: list[str]) -> bytes:
    """Cut the body before the part or the multipart that crosses a bound.

    Boundaries are declared in the top header and in the part headers (and in
    the headers of attached messages, which the stdlib parses too); every
    ``boundary=`` in the body counts, so text that merely mentions one can only
    make the count higher, never hide a part. Nesting is followed the way the
    stdlib does: a delimiter of an outer boundary closes the inner multiparts.
    """
    declarations: list[tuple[int, bytes]] = []
    top = _BOUNDARY_DECL_RE.search(head.lower())
    if top is not None:
        declarations.append((-1, _boundary_value(head, top)))
    lowered = body.lower()
    if not declarations and b"boundary" not in lowered:
        return body
    cut: int | None = None
    for match in _BOUNDARY_DECL_RE.finditer(lowered):
        if len(declarations) >= MAX_MULTIPARTS:
            cut = _line_start(body, match.start())
            hit.append("depth")
            break
        declarations.append((match.start(), _boundary_value(body, match)))
    scan = body if cut is None else body[:cut]
    distinct = sorted({b for _, b in declarations}, key=len, reverse=True)
    # Matched on "\n" + body: a literal prefix keeps the scan fast, and offsets
    # in the body are the match's start (the "\n" stands before the line).
    delimiter = re.compile(
        rb"(?m)\n--(" + b"|".join(re.escape(b) for b in distinct) + rb")(--)?[ \t]*\r?$"
    )
    stack: list[bytes] = []
    parts = 0
    pending = iter(declarations)
    nxt = next(pending, None)

    def declare_until(pos: int) -> int | None:
        """Open the multiparts declared before ``pos``; the cut, if one is too deep."""
        nonlocal nxt
        while nxt is not None and nxt[0] < pos:
            if nxt[1] not in stack:
                stack.append(nxt[1])
            if len(stack) > MAX_DEPTH:
                hit.append("depth")
                return _line_start(body, max(nxt[0], 0))
            nxt = next(pending, None)
        return None

    for match in delimiter.finditer(b"\n" + scan):
        too_deep = declare_until(match.start())
        if too_deep is not None:
            return body[:too_deep]
        boundary, closing = match.group(1), match.group(2)
        if boundary in stack:
            index = stack.index(boundary)
            del stack[index if closing else index + 1 :]
        if closing:
            continue
        parts += 1
        if parts > MAX_PARTS:
            hit.append("parts")
            return body[: match.start()]
    too_deep = declare_until(len(scan) + 1)
    if too_deep is not None:
        return body[:too_deep]
    return scan


def _boundary_value(original: bytes, match: re.Match[bytes]) -> bytes:
    group = 1 if match.group(1) is not None else 2
    return original[match.start(group) : match.end(group)].rstrip()


def _line_start(data: bytes, pos: int) -> int:
    return data.rfind(b"\n", 0, pos) + 1


class ParseTimeout(BaseException):
    """Raised by the budget's timer. A BaseException, so the parser's many
    ``except Exception`` guards cannot swallow it."""


def has_bare_lf(raw: bytes) -> bool:
    """Whether any line of `raw` ends in a bare LF (no CR before it): mail
    that the sink accepts as received but that real mail servers may refuse
    (docs/api.md, `bare_lf`). Two linear counts, nothing built."""
    return raw.count(b"\n") != raw.count(b"\r\n")
