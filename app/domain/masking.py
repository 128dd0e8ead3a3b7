"""Mask what a subject may carry that must not leave the signal's own view.

Pure. Subjects are attacker- and application-controlled text, and some carry
secrets ("Your login code is 739204", "Reset: https://app.example/r/4f9a..").
Wherever a subject goes beyond the signal view of its own namespace (the run's
evidence, dead-letter near misses, the recommendation, logs, webhooks) it goes
through :func:`mask_subject` first:

- a link (``scheme://…`` or ``www.…``) becomes ``<link>``: its host can be a
  per-user token as much as its path;
- an e-mail address becomes ``<address>``;
- a one-time code becomes ``<code>``: any run of letters and digits (of any
  script) of 4 or more characters with at least one digit (``739204``, ``AB12CD``, a hex
  token), and digit groups joined by a single ``-``, ``.`` or space when they
  make 4 or more characters together (``739-204``, ``739 204``);
- control characters become spaces.

Everything else (the words) is kept, so the subject stays recognisable.
Runs in time linear in the length of the subject.
"""

from __future__ import annotations

import re

__all__ = ["mask_subject"]

LINK = "<link>"
ADDRESS = "<address>"
CODE = "<code>"

# Each pattern starts only where its token starts (the look-behinds): a match
# attempt from inside a long run would rescan it, quadratic on a hostile subject.
_LINK_RE = re.compile(
    r"(?:(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*+://|(?<![\w.])www\.)\S*+", re.IGNORECASE
)
_ADDRESS_RE = re.compile(r"(?<![^\s@<>])[^\s@<>]++@[^\s@<>]++")
# A token holding a digit (letters and digits of any script: a full-width code
# is as much a code), then more such tokens joined by one separator.
_TOKEN = r"[^\W\d_]*+\d[^\W_]*+"
_CODE_RE = re.compile(rf"(?<![^\W_]){_TOKEN}(?:[-. ]{_TOKEN})*+")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def mask_subject(subject: str) -> str:
    """``subject`` with links, addresses and one-time codes replaced (see module)."""
    if not subject:
        return ""
    text = _CONTROL_RE.sub(" ", subject)
    text = _LINK_RE.sub(LINK, text)
    text = _ADDRESS_RE.sub(ADDRESS, text)
    return _CODE_RE.sub(_code, text)


def _code(match: re.Match[str]) -> str:
    value = match.group()
    alnum = sum(ch.isalnum() for ch in value)
    return CODE if alnum >= 4 else value
