"""The visible text and link targets of an HTML body, in linear time.

A small scanner instead of html.parser: the stdlib parser takes minutes on a few
hundred KiB of unclosed tags ("<a <a <a ..."), and an email body is attacker
controlled. Every pattern below either matches in one forward pass or does not
start at all (unclosed constructs run to the end of the input, as in browsers,
and the loops are possessive), so scanning is linear in the size of the HTML.
"""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Iterator
from typing import Literal

from app.domain.mail.charset import normalize_whitespace

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


def html_anchors(html: str) -> list[tuple[str, str]]:
    """Each ``<a href>`` of an HTML document with its visible text, in document
    order: ``(url, text)``, the URL as :func:`html_events` gives it, the text
    whitespace-normalised (``""`` for an image-only link). An anchor ends at
    ``</a>``, at the next ``<a``, or at the end. Linear time, never raises."""
    found: list[tuple[str, str]] = []
    href: str | None = None
    words: list[str] = []
    pos = 0

    def close() -> None:
        nonlocal href
        if href is not None:
            found.append((href, normalize_whitespace("".join(words))))
        href = None
        words.clear()

    for match in _HTML_TOKEN_RE.finditer(html):
        if href is not None and match.start() > pos:
            words.append(html_lib.unescape(html[pos : match.start()]))
        pos = match.end()
        name = (match.group("name") or "").lower()
        if href is not None and name in _BLOCK_TAGS:
            words.append(" ")
        if name != "a":
            continue
        close()
        if not match.group("end"):
            target = _HREF_RE.search(match.group("attrs") or "")
            if target:
                href = html_lib.unescape(next(g for g in target.groups() if g is not None)).strip()
    if href is not None and pos < len(html):
        words.append(html_lib.unescape(html[pos:]))
    close()
    return found
