"""The decoded view of one email, and the names of the bounds it hit."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from app.domain.mail.charset import normalize_whitespace
from app.domain.mail.html import strip_html

# SIGNALBOX_MATCH_TEXT_MAX_BYTES' default: what `body_contains` searches.
DEFAULT_TEXT_MAX_BYTES = 1024 * 1024
# An HTML-only message's text is searched in its first this many times
# max_bytes characters of HTML (markup takes room).
HTML_MARKUP_FACTOR = 4

BOUND_DEFECT_PREFIX = "BoundExceeded:"


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

    def searchable_text(self, max_bytes: int = DEFAULT_TEXT_MAX_BYTES) -> str:
        """What ``body_contains`` searches: :meth:`matchable_text`,
        NFC-normalised with whitespace runs collapsed, cut to its first
        ``max_bytes`` bytes (UTF-8). Made once per message (and bound): every
        signal and every look that searches this message reuses it, so 200
        signals on one address cost one normalisation, not 200."""
        cache: dict[int, str] = self.__dict__.setdefault("_searchable", {})
        text = cache.get(max_bytes)
        if text is None:
            # A character is at least one byte: cutting to max_bytes
            # characters first bounds the work before the exact cut (HTML
            # to a few times that, for its markup).
            if self.text and not self.text.isspace():
                raw = self.text[:max_bytes]
            else:
                raw = strip_html(self.html[: HTML_MARKUP_FACTOR * max_bytes])[:max_bytes]
            text = normalize_whitespace(unicodedata.normalize("NFC", raw))
            encoded = text.encode("utf-8")
            if len(encoded) > max_bytes:
                text = encoded[:max_bytes].decode("utf-8", errors="ignore")
            cache[max_bytes] = text
        return text

    @property
    def recipients(self) -> tuple[str, ...]:
        """To then Cc addresses, without repeats."""
        return tuple(dict.fromkeys(self.to + self.cc))


def bounds_exceeded(mail: ParsedMail) -> tuple[str, ...]:
    """The names of the bounds this message hit (``parts``, ``time``, ...)."""
    return tuple(
        d[len(BOUND_DEFECT_PREFIX) :] for d in mail.defects if d.startswith(BOUND_DEFECT_PREFIX)
    )
