"""Mask what a subject may carry that must not leave the signal's own view.

Pure. Subjects are attacker- and application-controlled text, and some carry
secrets ("Your login code is 739204", "Reset: https://app.example/r/4f9a..").
Wherever a subject goes beyond the signal view of its own namespace (the run's
evidence, dead-letter near misses, the recommendation, logs, webhooks) it goes
through :func:`mask_subject` first:

- a link becomes ``<link>``, from its start to the next white space: one with
  a scheme (``scheme://…``), one starting ``www.``, and a host without a
  scheme whose path carries a query string (``example.com/reset?token=abc``,
  ``example.com?t=1``: a ``?`` followed by a letter or digit); its host can be
  a per-user token as much as its path;
- an e-mail address becomes ``<address>``;
- a one-time code becomes ``<code>``: any run of letters and digits (of any
  script) of 4 or more characters with at least one digit (``739204``,
  ``AB12CD``, a hex token), and digit groups joined by a single ``-``, ``.``
  or space when they make 4 or more characters together (``739-204``,
  ``739 204``);
- a letters-only code becomes ``<code>`` too: a whole word of 6 to 10
  capitals (``KXQWJP``), or capitals groups joined by single hyphens that
  make 6 to 10 letters together (``KXQ-WJP``). A word with any lower-case
  letter stays (``Verify``, ``Welcome``, ``iOS``), and so do capitals words
  of under 6 or over 10 letters (``PIN``, ``CONFIRMATION``); an ALL-CAPS word
  of 6 to 10 letters (``URGENT``) cannot be told from a code and is masked;
- control characters become spaces.

Everything else (the words) is kept, so the subject stays recognisable.
Runs in time linear in the length of the subject, and masking a masked
subject changes nothing.
"""

from __future__ import annotations

import re

__all__ = ["PLAIN_ADDRESS_RE", "mask_addresses", "mask_subject"]

LINK = "<link>"
ADDRESS = "<address>"
CODE = "<code>"

CAPS_MIN, CAPS_MAX = 6, 10

# Each pattern starts only where its token starts (the look-behinds): a match
# attempt from inside a long run would rescan it, quadratic on a hostile subject.
_LINK_RE = re.compile(
    r"(?:(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*+://|(?<![\w.])www\.)\S*+", re.IGNORECASE
)
# A white-space run holding a "?" (matched from the run's start only), and,
# inside one piece of it that ends just before a "?", a host (labels, a
# letters-only top-level label) with an optional port and path reaching that
# end. The host pattern fails within the host's own characters, and its next
# start lies past them, so each piece is scanned once.
_QUERY_RUN_RE = re.compile(r"(?<!\S)[^\s?]*+\?\S*+")
_HOST_PATH_RE = re.compile(
    r"(?<![\w.@%-])(?:[^\W_][\w-]*+\.)++[^\W\d_]{2,}+(?::\d++)?+(?:/[^?]*+)?+\Z"
)
_ADDRESS_RE = re.compile(r"(?<![^\s@<>])[^\s@<>]++@[^\s@<>]++")
# A token holding a digit (letters and digits of any script: a full-width code
# is as much a code), then more such tokens joined by one separator.
_TOKEN = r"[^\W\d_]*+\d[^\W_]*+"
_CODE_RE = re.compile(rf"(?<![^\W_]){_TOKEN}(?:[-. ]{_TOKEN})*+")
# A whole word, or words joined by single hyphens (KXQ-WJP).
_WORDS_RE = re.compile(r"(?<![^\W_])[^\W_]++(?:-[^\W_]++)*+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


# A plain address anywhere in a sentence (a recipient typo's recommendation
# quotes two between single quotes).
PLAIN_ADDRESS_RE = re.compile(r"[A-Za-z0-9.!#$%&*+/=?^_`{|}~-]++@[A-Za-z0-9.-]++")


def mask_addresses(text: str) -> str:
    """`text` with every plain address replaced by ``<address>`` (what an
    operator sees of a recommendation: an operator never reads recipients)."""
    return PLAIN_ADDRESS_RE.sub(ADDRESS, text)


def mask_subject(subject: str) -> str:
    """``subject`` with links, addresses and one-time codes replaced (see module)."""
    if not subject:
        return ""
    text = _CONTROL_RE.sub(" ", subject)
    text = _LINK_RE.sub(LINK, text)
    if "?" in text:
        text = _QUERY_RUN_RE.sub(_query_link, text)
    text = _ADDRESS_RE.sub(ADDRESS, text)
    text = _CODE_RE.sub(_code, text)
    return _WORDS_RE.sub(_capitals, text)


def _query_link(match: re.Match[str]) -> str:
    """The run with a scheme-less link carrying a query masked, from the
    link's host to the run's end (as a link with a scheme is)."""
    run = match.group()
    start = 0
    while (mark := run.find("?", start)) != -1:
        # A query is "?" and a letter or digit: "Signed up at example.com?" stays.
        if run[mark + 1 : mark + 2].isalnum():
            host = _HOST_PATH_RE.search(run, start, mark)
            if host is not None:
                return run[: host.start()] + LINK
        start = mark + 1
    return run


def _code(match: re.Match[str]) -> str:
    value = match.group()
    alnum = sum(ch.isalnum() for ch in value)
    return CODE if alnum >= 4 else value


def _capitals(match: re.Match[str]) -> str:
    value = match.group()
    if _is_capitals_code(value.replace("-", "")):
        return CODE
    if "-" not in value:
        return value
    # The joined group is no code (a lower-case part, too long): each part on its own.
    return "-".join(CODE if _is_capitals_code(p) else p for p in value.split("-"))


def _is_capitals_code(value: str) -> bool:
    return CAPS_MIN <= len(value) <= CAPS_MAX and all(ch.isupper() or ch.isdigit() for ch in value)
