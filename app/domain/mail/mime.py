"""The stdlib MIME parser, guarded: headers and the first text and HTML parts.

:class:`MimeParser` reads one (already bounded) message. Headers are read
with the modern ``email.policy.default`` parser, skipped where a header is
plain enough to read as written, and read again from the raw text where the
modern parser raises. Any accessor may raise on malformed input: each is
called through :func:`_safe`.
"""

from __future__ import annotations

import email
import email.policy
import re
import unicodedata
from collections.abc import Callable, Iterator
from email.message import Message
from email.policy import Compat32, EmailPolicy
from typing import Any, TypeVar

from app.domain.mail.addresses import STRICT_ITEM_RE, bare_address, fallback_addresses
from app.domain.mail.bounds import MAX_DEPTH, MAX_MULTIPARTS, MAX_PARTS
from app.domain.mail.charset import (
    clean_text,
    decode_bytes,
    decode_raw_header,
    normalize_whitespace,
)
from app.domain.mail.parsed import ParsedMail

_T = TypeVar("_T")

# Headers that carry the run marker, in order of preference (docs/api.md, "Matching").
RUN_MARKER_HEADERS = ("X-Signalbox-Run", "X-Run-Id")

# The walk over the parsed tree keeps its own guard, in case the stdlib sees
# more structure than the raw scan did.
_MAX_PART_DEPTH = MAX_DEPTH + 1
_MAX_PARTS = MAX_PARTS + MAX_MULTIPARTS + 1
# Longest structured header handed to the modern (quadratic) header parser.
_MAX_PARSED_HEADER = 4096

# A header value of printable ASCII and folding whitespace, with no encoded
# word (``=?``): nothing in it to decode.
_PLAIN_VALUE_RE = re.compile(r"[\x20-\x7e\t\r\n]*")


class _RawHeaderPolicy(Compat32):
    """Compat32 that hands back header values exactly as they were on the wire.

    Used only when the modern parser raises on a header: the raw value is then
    decoded by hand (``decode_raw_header``).
    """

    # A plain str: what compat32 itself returns for unparsed headers.
    def header_fetch_parse(self, name: str, value: str) -> str:
        return value


class _BoundedPolicy(EmailPolicy):
    """``email.policy.default``, but structured headers are cut before parsing.

    The modern header parser is quadratic on hostile input (100 KB of ``"`` in a
    To header takes over a minute). Address headers longer than the bound are
    read by the linear ``email.utils.getaddresses`` instead (see
    ``MimeParser._addresses``); other structured headers (Content-Type, Message-ID,
    ...) have no legitimate reason to be that long. The Subject is parsed in
    linear time and is never cut.
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        # The stdlib parses a header anew on every read: a part's Content-Type
        # is read half a dozen times per parse (structure, maintype, charset,
        # ...). One instance serves one parse, so the cache is bounded by the
        # (already bounded) message. Policies are read-only: set it past that.
        object.__setattr__(self, "_parsed", {})

    def header_fetch_parse(self, name: str, value: str) -> Any:
        key = (name, value)
        cached = self._parsed.get(key)  # type: ignore[attr-defined]
        if cached is not None:
            return cached
        if len(value) > _MAX_PARSED_HEADER and name.lower() != "subject":
            value = value[:_MAX_PARSED_HEADER]
        parsed = super().header_fetch_parse(name, value)
        self._parsed[key] = parsed  # type: ignore[attr-defined]
        return parsed


class MimeParser:
    def __init__(self, raw: bytes, *, plain_fast_path: bool = True) -> None:
        self.raw = raw
        self.defects: dict[str, None] = {}  # ordered set
        # False reads every header with the modern parser (the reference the
        # fast path is tested against).
        self.plain_fast_path = plain_fast_path
        self.modern = True
        try:
            self.msg: Message = email.message_from_bytes(raw, policy=_BoundedPolicy())
        except Exception as exc:
            # The MIME parser reads Content-Type while it parses; a header such as
            # "((((..." makes the modern header parser recurse too deep. compat32
            # parses the same structure with plain string operations.
            self._note(f"ModernParserDefect:{type(exc).__name__}")
            self.modern = False
            self.msg = email.message_from_bytes(raw, policy=email.policy.compat32)

    def parse(self) -> ParsedMail:
        subject = self._subject()
        to = self._addresses("To")
        cc = self._addresses("Cc")
        senders = self._addresses("From")
        message_id = self._single("Message-ID")
        run_marker = None
        for name in RUN_MARKER_HEADERS:
            run_marker = self._single(name)
            if run_marker:
                break
        text, html = self._bodies()
        return ParsedMail(
            subject=subject,
            to=to,
            cc=cc,
            from_addr=senders[0] if senders else None,
            message_id_header=message_id,
            run_marker=run_marker,
            text=text,
            html=html,
            defects=tuple(self.defects),
        )

    # headers --------------------------------------------------------------

    def _note(self, defect: object) -> None:
        name = defect if isinstance(defect, str) else type(defect).__name__
        self.defects.setdefault(name, None)

    def _raw_values(self, name: str) -> list[str]:
        """The header's values as they were on the wire (folds kept), in order.

        Both policies store exactly that (``header_source_parse`` is the same
        in compat32 and the modern policy); only reading them parses."""
        key = name.lower()
        return [str(v) for k, v in self.msg.raw_items() if k.lower() == key]

    def _plain_values(self, name: str) -> list[str] | None:
        """The header's unfolded values when each is plain (see ``_PLAIN_VALUE_RE``):
        the modern parser would read such a value as itself, with no defect, so
        the (costly) parse is skipped. None when any is not plain."""
        if not self.plain_fast_path:
            return None
        values = self._raw_values(name)
        if not all(_PLAIN_VALUE_RE.fullmatch(v) and "=?" not in v for v in values):
            return None
        return [v.replace("\r", "").replace("\n", "") for v in values]

    def _header_values(self, name: str) -> list[object] | None:
        """The parsed header objects, or None when the modern parser raised."""
        if not self.modern:
            return None
        try:
            values: list[object] = list(self.msg.get_all(name) or [])
            for value in values:
                for defect in getattr(value, "defects", ()):
                    self._note(defect)
            return values
        except Exception:
            self._note(f"HeaderParseDefect:{name}")
            return None

    def _subject(self) -> str:
        plain = self._plain_values("Subject")
        if plain is not None:  # printable ASCII: already NFC, nothing to decode
            return normalize_whitespace(plain[0]) if plain else ""
        values = self._header_values("Subject")
        if values is None:
            decoded = [decode_raw_header(v) for v in self._raw_values("Subject")[:1]]
        else:
            decoded = [str(v) for v in values[:1]]
        subject = clean_text(decoded[0]) if decoded else ""
        return unicodedata.normalize("NFC", normalize_whitespace(subject))

    def _single(self, name: str) -> str | None:
        # Message-ID has a structured parser of its own; the others are unstructured.
        plain = self._plain_values(name) if name.lower() != "message-id" else None
        if plain is not None:
            return (normalize_whitespace(plain[0]) if plain else "") or None
        values = self._header_values(name)
        if values is None:
            strings = [decode_raw_header(v) for v in self._raw_values(name)[:1]]
        else:
            strings = [str(v) for v in values[:1]]
        value = normalize_whitespace(clean_text(strings[0])) if strings else ""
        return value or None

    def _addresses(self, name: str) -> tuple[str, ...]:
        raw_values = self._raw_values(name)
        found: list[str] | None = None
        if all(len(v) <= _MAX_PARSED_HEADER for v in raw_values):
            found = self._strict_addresses(name)
            if found is None:
                found = self._modern_addresses(name)
        else:
            self._note(f"LongHeaderDefect:{name}")
        if found is None:
            found = fallback_addresses([clean_text(v) for v in raw_values])
        return tuple(dict.fromkeys(a for a in map(bare_address, found) if a))

    def _strict_addresses(self, name: str) -> list[str] | None:
        """The addresses of a plain list (``STRICT_ITEM_RE``), read without the
        modern parser, which reads the same addresses and notes no defect in
        such a list; None when any value is anything else."""
        plain = self._plain_values(name)
        if plain is None:
            return None
        found: list[str] = []
        for value in plain:
            pos = 0
            while True:
                item = STRICT_ITEM_RE.match(value, pos)
                if item is None:
                    return None
                found.append(item.group(1) or item.group(2))
                pos = item.end()
                if pos == len(value):
                    break
                pos += 1  # the comma
        return found

    def _modern_addresses(self, name: str) -> list[str] | None:
        values = self._header_values(name)
        if values is None:
            return None
        try:
            return [
                str(address.addr_spec)
                for value in values
                for address in getattr(value, "addresses", ())
            ]
        except Exception:
            self._note(f"HeaderParseDefect:{name}")
            return None

    # bodies ---------------------------------------------------------------

    def _bodies(self) -> tuple[str, str]:
        text: str | None = None
        html: str | None = None
        for part in _leaf_parts(self.msg, self._note):
            for defect in getattr(part, "defects", ()):
                self._note(defect)
            ctype = _safe(part.get_content_type, "text/plain")
            if ctype not in ("text/plain", "text/html"):
                continue
            if _safe(part.get_content_disposition, None) == "attachment":
                continue
            if ctype == "text/plain" and text is None:
                text = self._decode_part(part)
            elif ctype == "text/html" and html is None:
                html = self._decode_part(part)
            if text is not None and html is not None:
                break
        for defect in getattr(self.msg, "defects", ()):
            self._note(defect)
        maintype = _safe(self.msg.get_content_maintype, "")
        broken_multipart = maintype == "multipart" and not _safe(self.msg.is_multipart, True)
        if text is None and html is None and broken_multipart:
            # A multipart without a usable boundary parses as one opaque blob;
            # matching on its raw text is better than matching on nothing.
            text = self._decode_part(self.msg)
        return text or "", html or ""

    def _decode_part(self, part: Message) -> str:
        try:
            data = part.get_payload(decode=True)
        except Exception:
            self._note("UndecodablePayloadDefect")
            payload = _safe(lambda: part.get_payload(), None)
            data = payload.encode("utf-8", "surrogateescape") if isinstance(payload, str) else b""
        if not isinstance(data, bytes):
            data = b""
        notes: list[str] = []
        charset: str | None = _safe(lambda: part.get_content_charset(), None)
        text = decode_bytes(data, charset, notes)
        for note in notes:
            self._note(note)
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        return clean_text(text)


def _leaf_parts(root: Message, note: Callable[[str], None]) -> Iterator[Message]:
    """Non-multipart parts in document order, not descending into attached messages.

    A ``message/rfc822`` part is a forwarded or bounced email: its text is not
    this message's text, so it is not searched.
    """
    stack: list[tuple[Message, int]] = [(root, 0)]
    seen = 0
    while stack:
        part, depth = stack.pop()
        seen += 1
        if seen > _MAX_PARTS:
            note("TooManyPartsDefect")
            return
        payload = _safe(part.get_payload, None)
        if _safe(part.is_multipart, False) and isinstance(payload, list):
            if _safe(part.get_content_maintype, "") == "message":
                continue
            if depth >= _MAX_PART_DEPTH:
                note("PartsTooDeepDefect")
                continue
            children = [p for p in payload if isinstance(p, Message)]
            stack.extend((child, depth + 1) for child in reversed(children))
        else:
            yield part


def _safe(fn: Callable[[], _T], default: _T) -> _T:
    """Call a parsed-message accessor; malformed headers can make any of them raise."""
    try:
        return fn()
    except Exception:
        return default
