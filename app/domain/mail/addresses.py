"""Addresses in To, Cc and From values: the plain fast paths and the fallback.

A header made only of plain items (``addr``, ``Name <addr>``, ``"Name" <addr>``)
is read with one regular expression, which reads the same addresses as the
modern parser; anything else goes to the parser, or, where it cannot be used,
to :func:`fallback_addresses`.
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Iterator

from app.domain.mail.bounds import LOGICAL_HEADER_RE, MAX_HEADER_BYTES, split_header_block
from app.domain.mail.charset import clean_text

# A To/Cc value simple enough that every parser reads the same addresses in
# it: comma-separated `addr`, `Name <addr>` or `"Name" <addr>`, ASCII only,
# no encoded words, comments, groups or quoted local parts.
_PLAIN_ADDR = rb"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9.-]+"
_PLAIN_ITEM_RE = re.compile(
    rb"[ \t]*(?:("
    + _PLAIN_ADDR
    + rb')|(?:"[^"\\]*"|[A-Za-z0-9 .\'_-]*)[ \t]*<('
    + _PLAIN_ADDR
    + rb")>)[ \t]*(?:,|$)"
)


# One item of an address list the modern parser reads as written, with no
# defect: a dot-atom address, bare or in angle brackets after an optional
# display name of plain words or one quoted string; then a comma or the end.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
# A dot-atom address with a host-name domain: every RFC 5322 parser reads it
# as written, with no defect (the SMTP sink's command fast path uses it too).
PLAIN_ADDR_SPEC = rf"{_ATEXT}(?:\.{_ATEXT})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
_STRICT_ADDR = PLAIN_ADDR_SPEC
STRICT_ITEM_RE = re.compile(
    rf"[ \t]*(?:({_STRICT_ADDR})|"
    rf"(?:\"[^\"\\]*\"|[A-Za-z0-9'_-]+(?:[ \t]+[A-Za-z0-9'_-]+)*)?[ \t]*<({_STRICT_ADDR})>)"
    r"[ \t]*(?=,|$)"
)


def header_recipients_within(raw: bytes, envelope: Iterator[str] | list[str]) -> bool:
    """True when every To and Cc address of `raw` is plainly one of `envelope`:
    a full parse could add no recipient (the sink then skips it). False when
    one is not, or when the header is anything but plain (then parse)."""
    head, _, _ = split_header_block(raw)
    if len(head) > MAX_HEADER_BYTES or not head.isascii():
        return False
    known = {e.lower() for e in envelope}
    for match in LOGICAL_HEADER_RE.finditer(head):
        name, colon, value = match.group(0).partition(b":")
        if not colon or name.strip().lower() not in (b"to", b"cc"):
            continue
        value = value.replace(b"\r", b"").replace(b"\n", b"").strip()
        pos = 0
        while pos < len(value):
            item = _PLAIN_ITEM_RE.match(value, pos)
            if item is None or item.end() == pos:
                return False
            address = (item.group(1) or item.group(2)).decode("ascii").lower()
            if address not in known:
                return False
            pos = item.end()
    return True


def header_block(raw: bytes) -> bytes:
    """The header block of `raw`, at most MAX_HEADER_BYTES of it (a copy: the
    message itself need not be kept)."""
    head, _, _ = split_header_block(raw[: MAX_HEADER_BYTES + 4])
    return bytes(head[:MAX_HEADER_BYTES])


def header_block_recipients(head: bytes) -> list[str]:
    """The To and Cc addresses a header block names, lower-cased, read from
    the header alone (no parse of the message): what the sink adds when it
    cannot hold a message for its parse."""
    values = []
    for match in LOGICAL_HEADER_RE.finditer(head):
        name, colon, value = match.group(0).partition(b":")
        if colon and name.strip().lower() in (b"to", b"cc"):
            unfolded = value.replace(b"\r", b"").replace(b"\n", b" ")
            values.append(unfolded.decode("utf-8", "replace").strip())
    return sorted({a for a in map(bare_address, fallback_addresses(values)) if a})


_ADDRESS_RE = re.compile(r"[^\s<>,;:\"()\[\]]+@[^\s<>,;:\"()\[\]]+")


def fallback_addresses(values: list[str]) -> list[str]:
    """Addresses from raw header values, for when the modern parser cannot be used."""
    try:
        return [address for _, address in email.utils.getaddresses(values)]
    except Exception:  # deeply nested comments overflow getaddresses' recursion
        return [m.group() for value in values for m in _ADDRESS_RE.finditer(value)]


def bare_address(value: str) -> str:
    address = clean_text(value).strip().strip("<>").strip().lower()
    # The modern parser reports an empty angle-addr as "<>"; that is nobody.
    return address if "@" in address else ""
