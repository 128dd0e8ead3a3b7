"""The sink's reading of a DATA section: a bare LF ends a line, as a CRLF does.

aiosmtpd ends a line at CRLF only. A message whose lines end in a bare LF (what
``smtplib.sendmail(sender, [to], msg.as_bytes())`` sends: it fixes line ends of
``str`` messages only) then reads as a single line, and one over 1,000 bytes is
refused with ``500 Line too long``, a reply that names the wrong cause. The
catchers users compare the sink with accept such mail, so the sink does too:
a line ends at LF (with or without the CR before it), the line length limit
applies to each such line, and the data ends at a line that is exactly
``.`` CRLF. The bytes are kept as received, bare LFs included (only the
dot-stuffing of RFC 5321 4.5.2 is undone); whether any line ended in a bare
LF is said on the message (``bare_lf``, docs/api.md), since real mail servers
may refuse such mail.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class DataRead:
    """One DATA section: the content as received, or the error reply to send."""

    content: bytes | None
    reply: str | None = None
    size: int = 0  # the bytes read, also of data refused


TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
TOO_MUCH = "552 Error: Too much mail data"


async def read_data(
    reader: asyncio.StreamReader, size_limit: int | None, line_limit: int
) -> DataRead:
    """Read up to the end-of-data line. Over ``size_limit`` bytes, or a line
    over ``line_limit``, reads on to the end (RFC 5321 4.2.5: the reply comes
    after the data) keeping nothing, and returns the error reply."""
    lines: list[bytes] = []
    size = 0
    error: str | None = None
    inside_long_line = False  # the rest of a line longer than the reader's buffer
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError as exc:
            # More than the reader's limit without a line end: too long. The
            # part read is dropped at once; nothing of it is kept.
            size += len(await reader.read(exc.consumed))
            error, inside_long_line = error or TOO_LONG, True
            lines.clear()
            continue
        if inside_long_line:  # the end of that long line, never the end of the data
            size += len(line)
            inside_long_line = False
            continue
        if line == b".\r\n":
            break
        size += len(line)
        if error is None and size_limit and size > size_limit:
            error = TOO_MUCH
        if error is None and len(line) > line_limit:
            error = TOO_LONG
        if error is not None:
            lines.clear()
            continue
        lines.append(line[1:] if line.startswith(b".") else line)
    if error is not None:
        return DataRead(None, error, size)
    return DataRead(b"".join(lines), size=size)
