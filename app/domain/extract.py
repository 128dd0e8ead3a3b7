"""Pull out what a consumer acts on: a short excerpt, the links, the one-time codes.

Pure and never raising for any :class:`ParsedMail`. The results go only into a
claim answer (docs/api.md, "Claims"); they must never be logged or put in evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.domain.mail import ParsedMail, html_events, normalize_whitespace

__all__ = ["EXCERPT_MAX_CHARS", "Extracted", "extract", "find_codes", "find_links"]

EXCERPT_MAX_CHARS = 500


@dataclass(frozen=True)
class Extracted:
    """What a claim hands the consumer.

    ``body_excerpt``: at most 500 characters of ``matchable_text()``, whitespace
    collapsed. ``links``: http(s) URLs in document order (text part, then HTML
    ``href``s and bare URLs), entities decoded, without repeats. ``codes``:
    one-time-code-like tokens from the text, in order, without repeats.
    """

    body_excerpt: str
    links: tuple[str, ...]
    codes: tuple[str, ...]


def extract(mail: ParsedMail) -> Extracted:
    """Extract the excerpt, links and codes of one parsed message."""
    text = mail.matchable_text()
    excerpt = normalize_whitespace(text)[:EXCERPT_MAX_CHARS].rstrip()
    links = [*find_links(mail.text), *_html_links(mail.html)]
    return Extracted(
        body_excerpt=excerpt,
        links=tuple(dict.fromkeys(links)),
        codes=find_codes(text),
    )


# --------------------------------------------------------------------------- links

# Characters that cannot be part of a bare URL in running text (RFC 3986 "unwise"
# characters plus quotes and whitespace).
_URL_RE = re.compile(r"""\bhttps?://[^\s<>"'`{}|\\^\[\]]+""", re.IGNORECASE)
_TRAILING_PUNCT = ".,;:!?)]}>'\"*"


def find_links(text: str) -> tuple[str, ...]:
    """Bare http(s) URLs in running text, in order, without repeats.

    Sentence punctuation after a URL is not part of it (``see https://x.io/a.`` ->
    ``https://x.io/a``); a closing parenthesis is kept when the URL opened one,
    as in ``https://en.wikipedia.org/wiki/Mail_(disambiguation)``.
    """
    found: list[str] = []
    for match in _URL_RE.finditer(text):
        url = _trim_url(match.group())
        if _has_host(url):
            found.append(url)
    return tuple(dict.fromkeys(found))


def _trim_url(url: str) -> str:
    opens, closes = url.count("("), url.count(")")
    end = len(url)
    while end and url[end - 1] in _TRAILING_PUNCT:
        if url[end - 1] == ")":
            if opens >= closes:
                break
            closes -= 1
        end -= 1
    return url[:end]


def _has_host(url: str) -> bool:
    rest = url.split("://", 1)[1] if "://" in url else ""
    return bool(rest) and rest[0] not in "/?#"


def _html_links(html: str) -> list[str]:
    """``href`` targets and bare URLs in the visible text, in document order."""
    links: list[str] = []
    for kind, value in html_events(html):
        if kind == "href":
            if _URL_RE.match(value) and _has_host(value):
                links.append(value)
        elif kind == "text":
            links.extend(find_links(value))
    return links


# --------------------------------------------------------------------------- codes

# A token of 4-10 upper-case letters/digits standing alone (no letter or digit,
# of either case, glued to it).
_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9])[A-Z0-9]{4,10}(?![A-Za-z0-9])")
# The look-behind anchors a match at the start of a word: without it a long run of
# word characters is rescanned from every position (quadratic on a 10 MiB body).
_EMAIL_RE = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_HEX_COLOUR_RE = re.compile(r"(?:[0-9A-Fa-f]{3}|[0-9A-Fa-f]{4}|[0-9A-Fa-f]{6}|[0-9A-Fa-f]{8})")
# Separators that join digit groups into dates, times, phone numbers, amounts and
# versions (2026-05-01, 12:30:00, 555-0123, 1.2345, 1,000,000).
_JOINERS = "-/.:,"
_MONTHS = re.compile(
    r"\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\b\.?\s*\d{0,2},?\s*$",
    re.IGNORECASE,
)
_YEAR_PREFIX = re.compile(r"(?:©|\(c\)|\bcopyright|\byear)\s*$", re.IGNORECASE)


def find_codes(text: str) -> tuple[str, ...]:
    """One-time-code-like tokens in ``text``, in order, without repeats.

    A code is 4-10 characters standing alone: all digits, or upper-case letters
    and digits with at least one digit. Not codes: anything inside a URL or an
    email address, hex colours (``#A1B2C3``), groups joined to other digits by
    ``- / . : ,`` (dates, times, phone numbers, amounts, versions), and a year
    after a month name or a copyright sign (``May 5, 2026``, ``© 2026``).
    """
    # Blank out URLs and addresses, keeping offsets, so their pieces are not codes
    # and the context checks below still see the real neighbours.
    masked = _URL_RE.sub(lambda m: " " * len(m.group()), text)
    masked = _EMAIL_RE.sub(lambda m: " " * len(m.group()), masked)
    found: list[str] = []
    for match in _TOKEN_RE.finditer(masked):
        token = match.group()
        if not any(ch.isdigit() for ch in token):
            continue
        if _is_false_positive(masked, match.start(), match.end(), token):
            continue
        found.append(token)
    return tuple(dict.fromkeys(found))


def _is_false_positive(text: str, start: int, end: int, token: str) -> bool:
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    if before == "#" and _HEX_COLOUR_RE.fullmatch(token):
        return True
    if before in _JOINERS and start >= 2 and text[start - 2].isdigit():
        return True
    if after in _JOINERS and end + 1 < len(text) and text[end + 1].isdigit():
        return True
    if len(token) == 4 and token.isdigit() and token[:2] in ("19", "20"):
        context = text[max(0, start - 20) : start]
        if _MONTHS.search(context) or _YEAR_PREFIX.search(context):
            return True
    return False
