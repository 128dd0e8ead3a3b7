"""Turn the raw bytes of an email into the few decoded fields Signalbox matches on.

Pure: bytes in, values out. ``parse_mail`` never raises, whatever it is given
(malformed MIME is "matched on what could be decoded, never a crash"). What
could not be decoded cleanly is named in ``ParsedMail.defects``.

Every string this module returns is valid Unicode (no lone surrogates) and
holds no NUL character, so callers can log it, JSON-encode it and store it in
PostgreSQL ``text`` columns without further cleaning.

Bounded time, whatever the input
--------------------------------
The stdlib parser builds the whole MIME tree before anything can stop it, and
parts of it are superlinear (a 400 KB folded Subject took 13 s, 10,000 flat
parts 14 s). So the raw bytes are checked first, with linear scans that build
nothing (``app.domain.mail_bounds``): the header block's size and line count,
the longest unfolded header, the number of body lines and MIME parts and the
nesting depth of multiparts. A message over a bound is never handed whole to the stdlib: it is
parsed on a bounded view (headers cut to the bound, the body cut before the
part that crossed it) and ``ParsedMail.defects`` names each bound hit as
``BoundExceeded:<bound>`` (``header_bytes``, ``header_lines``,
``header_length``, ``body_lines``, ``parts``, ``depth``, ``time``).

On top of the bounds, each parse has a hard budget of CPU time
(``PARSE_TIME_BUDGET_SECONDS``; CPU, not wall time, so a loaded machine does not
cut legitimate mail short), enforced where it can be:

- in a process's main thread (a Celery prefork child runs its tasks there, and
  so does a ``ProcessPoolExecutor`` worker), ``signal.setitimer(ITIMER_VIRTUAL)``
  interrupts the parse; the result then holds the headers read by a linear
  fallback and ``BoundExceeded:time``. An outer virtual timer that would fire
  sooner is left alone, and one that would fire later is re-armed after;
- the SMTP sink never parses on its event loop: it stores the raw bytes,
  answers, and parses in a worker process (``app/smtp/parsing.py``), where the
  first rule applies, and the sink stops waiting for a parse stuck past a
  generous wall-clock limit;
- in any other thread (the API's request threads) signals cannot interrupt,
  and the bounds alone keep a parse short.

Callbacks registered with :func:`on_bound_exceeded` hear of every bound hit
(the metrics module counts them); they are the only side effect here.
"""

from __future__ import annotations

import codecs
import dataclasses
import email
import email.header
import email.parser
import email.policy
import email.utils
import html as html_lib
import re
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from email.message import Message
from email.policy import Compat32, EmailPolicy
from typing import Any, Literal, TypeVar

from app.domain.mail_bounds import (
    ESSENTIAL_HEADERS,
    LOGICAL_HEADER_RE,
    MAX_DEPTH,
    MAX_HEADER_BYTES,
    MAX_HEADER_LENGTH,
    MAX_MULTIPARTS,
    MAX_PARTS,
    BoundedView,
    ParseTimeout,
    bound_view,
    cpu_budget,
    split_header_block,
)

__all__ = [
    "BOUND_DEFECT_PREFIX",
    "MAX_HEADER_LENGTH",
    "PARSE_TIME_BUDGET_SECONDS",
    "PLAIN_ADDR_SPEC",
    "BoundedView",
    "HtmlEvent",
    "ParsedMail",
    "bound_view",
    "bounds_exceeded",
    "html_events",
    "normalize_whitespace",
    "on_bound_exceeded",
    "parse_mail",
    "report_bounds",
    "strip_html",
]

_T = TypeVar("_T")

# Headers that carry the run marker, in order of preference (docs/api.md, "Matching").
RUN_MARKER_HEADERS = ("X-Signalbox-Run", "X-Run-Id")

PARSE_TIME_BUDGET_SECONDS = 3.0
BOUND_DEFECT_PREFIX = "BoundExceeded:"

# The walk over the parsed tree keeps its own guard, in case the stdlib sees
# more structure than the raw scan did.
_MAX_PART_DEPTH = MAX_DEPTH + 1
_MAX_PARTS = MAX_PARTS + MAX_MULTIPARTS + 1
# Longest structured header handed to the modern (quadratic) header parser.
_MAX_PARSED_HEADER = 4096


@dataclass(frozen=True)
class ParsedMail:
    """The decoded view of one email.

    ``subject`` has RFC 2047 encoded words decoded, whitespace collapsed and is
    NFC-normalised (``''`` when absent). ``to``, ``cc`` and ``from_addr`` hold
    lower-cased bare addresses (``a@example.com``, no display name).
    ``run_marker`` is ``X-Signalbox-Run``, else ``X-Run-Id``, stripped, or None.
    ``text`` and ``html`` are the first text/plain and text/html
    parts that are not attachments, decoded with their charset and with line
    endings normalised to ``\\n``; each is ``''`` when the message has none.
    ``defects`` names what was malformed (e.g. ``InvalidBase64CharactersDefect``,
    ``UnknownCharsetDefect``); it is empty for a clean message.
    """

    subject: str
    to: tuple[str, ...]
    cc: tuple[str, ...]
    from_addr: str | None
    message_id_header: str | None
    run_marker: str | None
    text: str
    html: str
    defects: tuple[str, ...] = ()

    def matchable_text(self) -> str:
        """The text ``body_contains`` and extraction look at.

        The text/plain part as decoded when it has any non-blank content,
        else the HTML part through :func:`strip_html` (tags removed, entities
        decoded, script/style dropped, whitespace collapsed).
        """
        if self.text.strip():
            return self.text
        return strip_html(self.html)

    @property
    def recipients(self) -> tuple[str, ...]:
        """To then Cc addresses, without repeats."""
        return tuple(dict.fromkeys(self.to + self.cc))


def parse_mail(raw: bytes, *, time_budget: float | None = PARSE_TIME_BUDGET_SECONDS) -> ParsedMail:
    """Parse raw RFC 5322 bytes into a :class:`ParsedMail`; never raises.

    The bytes are first cut to the bounds (:func:`bound_view`); a parse that
    still runs past ``time_budget`` seconds (where a timer can interrupt it,
    see the module docstring; ``None`` for no timer) gives the headers read
    by a linear fallback and ``BoundExceeded:time``.

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
        with cpu_budget(time_budget):
            mail = _parse_view(view)
    except ParseTimeout:
        mail = _headers_only(view, "time")
    report_bounds(mail.defects)
    return mail


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


# A header value of printable ASCII and folding whitespace, with no encoded
# word (``=?``): nothing in it to decode.
_PLAIN_VALUE_RE = re.compile(r"[\x20-\x7e\t\r\n]*")
# One item of an address list the modern parser reads as written, with no
# defect: a dot-atom address, bare or in angle brackets after an optional
# display name of plain words or one quoted string; then a comma or the end.
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
# A dot-atom address with a host-name domain: every RFC 5322 parser reads it
# as written, with no defect (the SMTP sink's command fast path uses it too).
PLAIN_ADDR_SPEC = rf"{_ATEXT}(?:\.{_ATEXT})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
_STRICT_ADDR = PLAIN_ADDR_SPEC
_STRICT_ITEM_RE = re.compile(
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


def _parse_view(view: BoundedView) -> ParsedMail:
    bounds = tuple(BOUND_DEFECT_PREFIX + b for b in view.bounds)
    try:
        mail = _Parser(view.raw).parse()
    except Exception as exc:  # last resort: the promise is "never a crash"
        text = _clean(_decode_bytes(view.raw, None, []))
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


def bounds_exceeded(mail: ParsedMail) -> tuple[str, ...]:
    """The names of the bounds this message hit (``parts``, ``time``, ...)."""
    return tuple(
        d[len(BOUND_DEFECT_PREFIX) :] for d in mail.defects if d.startswith(BOUND_DEFECT_PREFIX)
    )


_BOUND_OBSERVERS: list[Callable[[str], None]] = []


def on_bound_exceeded(observer: Callable[[str], None]) -> None:
    """Call ``observer(bound)`` for every bound a later :func:`parse_mail` hits
    in this process (a parse in another process reports to that process)."""
    if observer not in _BOUND_OBSERVERS:
        _BOUND_OBSERVERS.append(observer)


def report_bounds(defects: tuple[str, ...]) -> None:
    """Tell the observers of the bounds named in ``defects``. :func:`parse_mail`
    does it itself; call it for a result parsed in another process."""
    for defect in defects:
        if not defect.startswith(BOUND_DEFECT_PREFIX):
            continue
        for observer in list(_BOUND_OBSERVERS):
            with suppress(Exception):  # an observer never breaks parsing
                observer(defect[len(BOUND_DEFECT_PREFIX) :])


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace (including NBSP and line breaks) to one space."""
    return " ".join(text.split())


def strip_html(html: str) -> str:
    """Return the visible text of an HTML document as one whitespace-normalised line.

    Tags are removed, character references decoded (``&amp;`` -> ``&``), and
    the content of ``script``, ``style``, ``title`` and ``template`` and comments
    dropped. Block elements and ``<br>`` separate words so ``<td>A</td><td>B</td>``
    reads ``A B``. Never raises, and runs in linear time whatever the markup.
    """
    if not html:
        return ""
    text = "".join(value for kind, value in html_events(html) if kind != "href")
    return normalize_whitespace(text)


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
            values[key] = _clean(unfolded.decode("utf-8", "surrogateescape"))

    def addresses(key: str) -> tuple[str, ...]:
        found = _fallback_addresses([values[key]]) if key in values else []
        return tuple(dict.fromkeys(a for a in map(_bare_address, found) if a))

    def single(key: str) -> str | None:
        text = normalize_whitespace(_decode_raw_header(values.get(key, "")))
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


# --------------------------------------------------------------------------- parsing


class _RawHeaderPolicy(Compat32):
    """Compat32 that hands back header values exactly as they were on the wire.

    Used only when the modern parser raises on a header: the raw value is then
    decoded by hand (``_decode_raw_header``).
    """

    # typeshed types the base method's return as Any-ish header objects; a
    # plain str is what compat32 itself returns for unparsed headers.
    def header_fetch_parse(self, name: str, value: str) -> str:  # type: ignore[override]
        return value


class _BoundedPolicy(EmailPolicy):
    """``email.policy.default``, but structured headers are cut before parsing.

    The modern header parser is quadratic on hostile input (100 KB of ``"`` in a
    To header takes over a minute). Address headers longer than the bound are
    read by the linear ``email.utils.getaddresses`` instead (see
    ``_Parser._addresses``); other structured headers (Content-Type, Message-ID,
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


class _Parser:
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
            decoded = [_decode_raw_header(v) for v in self._raw_values("Subject")[:1]]
        else:
            decoded = [str(v) for v in values[:1]]
        subject = _clean(decoded[0]) if decoded else ""
        return unicodedata.normalize("NFC", normalize_whitespace(subject))

    def _single(self, name: str) -> str | None:
        # Message-ID has a structured parser of its own; the others are unstructured.
        plain = self._plain_values(name) if name.lower() != "message-id" else None
        if plain is not None:
            return (normalize_whitespace(plain[0]) if plain else "") or None
        values = self._header_values(name)
        if values is None:
            strings = [_decode_raw_header(v) for v in self._raw_values(name)[:1]]
        else:
            strings = [str(v) for v in values[:1]]
        value = normalize_whitespace(_clean(strings[0])) if strings else ""
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
            found = _fallback_addresses([_clean(v) for v in raw_values])
        return tuple(dict.fromkeys(a for a in map(_bare_address, found) if a))

    def _strict_addresses(self, name: str) -> list[str] | None:
        """The addresses of a plain list (``_STRICT_ITEM_RE``), read without the
        modern parser, which reads the same addresses and notes no defect in
        such a list; None when any value is anything else."""
        plain = self._plain_values(name)
        if plain is None:
            return None
        found: list[str] = []
        for value in plain:
            pos = 0
            while True:
                item = _STRICT_ITEM_RE.match(value, pos)
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
        text = _decode_bytes(data, charset, notes)
        for note in notes:
            self._note(note)
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        return _clean(text)


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


# --------------------------------------------------------------------------- decoding

_SURROGATE_RUN = re.compile("[\udc80-\udcff]+")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    """Make a string safe to store: recover raw 8-bit bytes, drop NULs and lone surrogates.

    The email package smuggles undecodable header/body bytes through as
    surrogate escapes; those are decoded here as UTF-8, else Windows-1252.
    """
    if _LONE_SURROGATE.search(text):
        text = _SURROGATE_RUN.sub(_decode_escaped_run, text)
        text = _LONE_SURROGATE.sub("\ufffd", text)
    return text.replace("\x00", "")


def _decode_escaped_run(match: re.Match[str]) -> str:
    data = match.group().encode("utf-8", "surrogateescape")
    return _decode_bytes(data, None, [])


def _decode_bytes(data: bytes, charset: str | None, notes: list[str]) -> str:
    """Decode body bytes, honouring ``charset`` when it is a real text encoding.

    ``us-ascii`` labels are read as UTF-8 (a superset, and mislabelled UTF-8 is
    common); ``iso-8859-1`` as Windows-1252 first, as browsers do, because
    senders routinely put curly quotes (0x80-0x9f) in "latin-1" text.
    """
    codec: str | None = None
    if charset:
        try:
            codec = codecs.lookup(charset.strip().strip("\"'")).name
        except (LookupError, ValueError):
            notes.append("UnknownCharsetDefect")
    if codec == "ascii":
        codec = "utf-8"
    attempts: list[str] = []
    if codec == "latin-1" or codec == "iso8859-1":
        attempts = ["cp1252", "latin-1"]
    elif codec:
        attempts = [codec]
    for attempt in attempts:
        try:
            return data.decode(attempt)
        except Exception:
            continue
    if codec:
        try:
            decoded = data.decode(codec, "replace")
            notes.append("CharsetMismatchDefect")
            return decoded
        except Exception:  # not a text codec ("base64", "rot13", ...)
            notes.append("UnknownCharsetDefect")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _decode_raw_header(value: str) -> str:
    """Decode a raw header value by hand: 8-bit bytes, then RFC 2047 encoded words."""
    value = _clean(value)
    try:
        parts = email.header.decode_header(value)
    except Exception:
        return value
    out: list[str] = []
    for chunk, charset in parts:
        if isinstance(chunk, str):
            out.append(chunk)
        else:
            out.append(_decode_bytes(chunk, charset, []))
    return "".join(out)


_ADDRESS_RE = re.compile(r"[^\s<>,;:\"()\[\]]+@[^\s<>,;:\"()\[\]]+")


def _fallback_addresses(values: list[str]) -> list[str]:
    """Addresses from raw header values, for when the modern parser cannot be used."""
    try:
        return [address for _, address in email.utils.getaddresses(values)]
    except Exception:  # deeply nested comments overflow getaddresses' recursion
        return [m.group() for value in values for m in _ADDRESS_RE.finditer(value)]


def _bare_address(value: str) -> str:
    address = _clean(value).strip().strip("<>").strip().lower()
    # The modern parser reports an empty angle-addr as "<>"; that is nobody.
    return address if "@" in address else ""


# --------------------------------------------------------------------------- HTML
#
# A small scanner instead of html.parser: the stdlib parser takes minutes on a few
# hundred KiB of unclosed tags ("<a <a <a ..."), and an email body is attacker
# controlled. Every pattern below either matches in one forward pass or does not
# start at all (unclosed constructs run to the end of the input, as in browsers,
# and the loops are possessive), so scanning is linear in the size of the HTML.

_ATTRS = r"""(?:[^>"']++|"[^"]*+(?:"|\Z)|'[^']*+(?:'|\Z))*+"""
_HTML_TOKEN_RE = re.compile(
    r"<!--.*?(?:-->|\Z)"  # comment
    r"|<[!?][^>]*+(?:>|\Z)"  # doctype, CDATA, processing instruction, bogus comment
    # Elements whose content is never visible text: skipped whole.
    rf"|<(?P<hidden>script|style|title|template)\b{_ATTRS}(?:>|\Z).*?(?:</(?P=hidden)\s*>|\Z)"
    rf"|<(?P<end>/)?(?P<name>[a-zA-Z][^\s/>]*+)(?P<attrs>{_ATTRS})(?:>|\Z)",
    re.DOTALL | re.IGNORECASE,
)
_HREF_RE = re.compile(
    r"""(?:^|[\s"'/])href\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))""", re.IGNORECASE
)
# Elements that start a new line when rendered; they must separate words.
_BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt",
        "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4",
        "h5", "h6", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section",
        "table", "tbody", "td", "tfoot", "th", "thead", "tr", "ul",
    }
)  # fmt: skip

HtmlEvent = tuple[Literal["text", "break", "href"], str]


def html_events(html: str) -> Iterator[HtmlEvent]:
    """Scan HTML into what a reader of the rendered email would meet, in document order.

    Yields ``("text", visible_text)`` with character references decoded,
    ``("break", " ")`` where a block element separates words, and
    ``("href", url)`` for each ``<a>``/``<area>`` target (entities decoded,
    surrounding whitespace removed). Comments, declarations and the content of
    ``script``, ``style``, ``title`` and ``template`` yield nothing. Never raises;
    runs in time linear in ``len(html)``.
    """
    pos = 0
    for match in _HTML_TOKEN_RE.finditer(html):
        if match.start() > pos:
            yield "text", html_lib.unescape(html[pos : match.start()])
        pos = match.end()
        name = (match.group("name") or "").lower()
        if not name:
            continue
        if name in _BLOCK_TAGS:
            yield "break", " "
        if name in ("a", "area") and not match.group("end"):
            href = _HREF_RE.search(match.group("attrs") or "")
            if href:
                value = next(g for g in href.groups() if g is not None)
                yield "href", html_lib.unescape(value).strip()
    if pos < len(html):
        yield "text", html_lib.unescape(html[pos:])
