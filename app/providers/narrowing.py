"""What a polled provider has to download for one look, decided without I/O.

A look is made for a batch of signals (`SearchQuery`): each recipient wants
the mail addressed to it from its own window on, plus the latest few just
before it (near misses worth reporting). A polled provider lists what it
holds cheaply (MailDev's listing, IMAP's SEARCH) and downloads a message only
when one of those recipients may be named in it inside its span.

The rule must never drop a message the matcher would take (docs/api.md,
"Nothing before the deadline is lost"), so it errs towards downloading:

- a recipient is *named* in a header when its local part and its domain
  both occur in the header's text, case-insensitively: a superset of every
  way a parser can read the address there (display names, comments, obsolete
  spacing around ``@``, quoted local parts);
- a recipient that cannot be looked for as plain text (not printable ASCII,
  with spaces or quotes, without ``@``) is taken to be named in every
  message, so its whole span is downloaded, as before narrowing;
- a query without recipients narrows nothing: everything since `since`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

# As the sink: near misses before a window are reported, a busy address's
# latest few are enough.
BEFORE_WINDOW_PER_RECIPIENT = 20

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Span:
    """One recipient's part of a look: mail received at or after `window` can
    match; mail from `start` (the near-miss lookback) up to it is a near miss.
    Both are floored to the provider's precision."""

    recipient: str
    start: datetime
    window: datetime
    searchable: bool


@dataclass(frozen=True)
class Narrowing:
    """The spans of a look; `since` is the earliest `start` (floored). With no
    spans (a query without recipients) everything since `since` is wanted."""

    since: datetime
    spans: tuple[Span, ...]

    @property
    def narrowed(self) -> bool:
        return bool(self.spans)


def narrowing(
    since: datetime,
    recipients: Iterable[str],
    windows: Mapping[str, datetime],
    precision: timedelta,
) -> Narrowing:
    """The spans of a `SearchQuery` (its `since`, `recipients`, `windows`) for
    a provider whose stamps have resolution `precision`.

    Each recipient's near-miss lookback is the query's (its earliest window
    minus `since`), counted back from the recipient's own window.
    """
    floor = _as_utc(_floor(since, precision))
    opens = {r.lower(): _as_utc(_floor(windows.get(r, since), precision)) for r in recipients if r}
    if not opens:
        return Narrowing(since=floor, spans=())
    lookback = max(timedelta(0), min(opens.values()) - floor)
    spans = tuple(
        Span(
            recipient=r,
            start=max(floor, _floor(_minus(w, lookback), precision)),
            window=w,
            searchable=searchable(r),
        )
        for r, w in sorted(opens.items())
    )
    return Narrowing(since=min(s.start for s in spans), spans=spans)


def searchable(recipient: str) -> bool:
    """Whether `recipient` can be looked for as text in a header (and sent as
    an IMAP quoted string): printable ASCII, one ``@``, no space, quote,
    backslash or encoded word."""
    return (
        recipient.isascii()
        and recipient.isprintable()
        and recipient.count("@") == 1
        and not any(c in recipient for c in ' "\\')
        # An encoded word is decoded differently by every parser.
        and "=?" not in recipient
        and all(recipient.split("@"))
    )


def header_forms(header_text: str) -> tuple[str, str]:
    """The forms of a header's (decoded) text `named_in` looks in: as written,
    and with the comments, quoting, escapes and white space a parser drops
    taken out (``"a""b" (x) @ host`` reads as ``ab@host``); lower-cased."""
    text = header_text.replace("\x00", "").lower()
    # Line by line: each line is a header of its own (an unclosed comment in
    # To must not hide Cc).
    return text, "\n".join(_squeeze(line) for line in text.split("\n"))


def named_in(recipient: str, forms: tuple[str, ...]) -> bool:
    """Whether `recipient` (lower-cased, `searchable`) may be an address of a
    header (its `header_forms`): its local part and its domain both occur in
    one of the forms."""
    local, _, domain = recipient.rpartition("@")
    return any(local in form and domain in form for form in forms)


_SQUEEZED = re.compile(r'["\\ \t\r]+')


def _squeeze(text: str) -> str:
    """`text` without comments (nested; one pass, linear), quotes, backslashes
    and white space (line breaks aside)."""
    kept: list[str] = []
    depth = 0
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif not depth:
            kept.append(c)
    return _SQUEEZED.sub("", "".join(kept))


def _floor(moment: datetime, precision: timedelta) -> datetime:
    moment = _as_utc(moment)
    if precision <= timedelta(0):
        return moment
    return moment - (moment - _EPOCH) % precision


def _minus(moment: datetime, delta: timedelta) -> datetime:
    try:
        return moment - delta
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def _as_utc(moment: datetime) -> datetime:
    # A naive moment is UTC, the server-wide convention.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
