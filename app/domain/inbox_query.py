"""The inbox's search (`?q=`, and Mailpit's `query`), parsed once into a
query object; `app/db/inbox.py` runs it as indexed SQL.

Mailpit's syntax, the subset Signalbox offers: terms separated by spaces,
all AND-ed; `to:`, `from:`, `cc:`, `subject:`, `message-id:` (a value may
be quoted: `subject:"two words"`), `after:` and `before:` (a date
`2026-12-06`, an ISO 8601 timestamp, or Unix seconds; UTC unless the
timestamp says otherwise), `has:attachment`, `is:read`, `is:unread`, free
words and `"quoted phrases"` (looked up in the subject and the text), and
`-` (or `!`) before any term to negate it.

Anything else that looks like a keyword Mailpit knows but Signalbox does
not offer (`bcc:`, `tag:`, `larger:`, …), an unterminated quote, an empty
value or a date that is not one raises :class:`QueryError` naming the term.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from enum import StrEnum


class QueryError(ValueError):
    """The search does not parse: `term` is the offending term as written."""

    def __init__(self, term: str, why: str) -> None:
        super().__init__(f"search term {term!r}: {why}")
        self.term = term
        self.why = why


class Kind(StrEnum):
    TO = "to"
    FROM = "from"
    CC = "cc"
    SUBJECT = "subject"
    MESSAGE_ID = "message-id"
    AFTER = "after"
    BEFORE = "before"
    HAS_ATTACHMENT = "has:attachment"
    READ = "is:read"
    UNREAD = "is:unread"
    WORD = "word"
    PHRASE = "phrase"


# Keywords whose value is text.
TEXT_KEYS = frozenset({Kind.TO, Kind.FROM, Kind.CC, Kind.SUBJECT, Kind.MESSAGE_ID})
DATE_KEYS = frozenset({Kind.AFTER, Kind.BEFORE})
# Mailpit's keywords Signalbox does not offer: refused, not searched as words.
UNSUPPORTED_KEYS = frozenset({"bcc", "reply-to", "tag", "larger", "smaller", "addressed"})
FLAGS = {
    ("has", "attachment"): Kind.HAS_ATTACHMENT,
    ("has", "attachments"): Kind.HAS_ATTACHMENT,
    ("is", "read"): Kind.READ,
    ("is", "unread"): Kind.UNREAD,
}

# Terms per query and characters per search: a query is parsed and run once
# per request; a bound keeps one request's SQL small.
MAX_TERMS = 32
MAX_LENGTH = 1000

_KEY = re.compile(r"^([a-z][a-z-]*):", re.IGNORECASE)
_WORDISH = re.compile(r"\w")


@dataclass(frozen=True)
class Term:
    """One term: `kind`, its `value` (text, a UTC datetime, or None for a
    flag), and whether it is `negated`."""

    kind: Kind
    value: str | datetime | None = None
    negated: bool = False


@dataclass(frozen=True)
class InboxQuery:
    """Every term of a search, in the order written (AND-ed)."""

    terms: tuple[Term, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.terms)


def normalise_message_id(value: str | None) -> str | None:
    """A Message-ID as stored and searched: stripped of blanks and of its angle brackets."""
    if value is None:
        return None
    value = value.strip()
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    return value or None


def parse_query(text: str) -> InboxQuery:
    """The query object of a search; QueryError naming the bad term otherwise."""
    if len(text) > MAX_LENGTH:
        raise QueryError(text[:40] + "…", f"a search is at most {MAX_LENGTH} characters")
    if "\x00" in text:
        raise QueryError(text[:40], "a search holds no NUL character")
    terms = tuple(_term(raw) for raw in _split(text))
    if len(terms) > MAX_TERMS:
        raise QueryError(text[:40] + "…", f"a search has at most {MAX_TERMS} terms")
    return InboxQuery(terms)


def _split(text: str) -> list[str]:
    """The terms as written: runs of non-blank characters, a quoted part
    (`"…"`) kept whole with its blanks."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        start = i
        while i < n and not text[i].isspace():
            if text[i] == '"':
                close = text.find('"', i + 1)
                if close < 0:
                    raise QueryError(text[start:], "the quote is not closed")
                i = close + 1
            else:
                i += 1
        out.append(text[start:i])
    return out


def _unquote(term: str, value: str) -> str:
    if value.startswith('"'):
        if len(value) < 2 or not value.endswith('"') or '"' in value[1:-1]:
            raise QueryError(term, "a quoted value is one quoted part")
        return value[1:-1]
    if '"' in value:
        raise QueryError(term, "a quote may only start a value")
    return value


def _term(raw: str) -> Term:
    negated = raw[0] in "-!"
    body = raw[1:] if negated else raw
    if not body:
        raise QueryError(raw, "negation of nothing")
    key = _KEY.match(body)
    if key is None:
        value = _unquote(raw, body)
        if not _WORDISH.search(value):
            raise QueryError(raw, "no letters or digits to look for")
        return Term(Kind.PHRASE if body.startswith('"') else Kind.WORD, value, negated)
    name = key.group(1).lower()
    value = _unquote(raw, body[key.end() :])
    if name in UNSUPPORTED_KEYS:
        raise QueryError(raw, f"{name}: is not a search Signalbox offers")
    flag = FLAGS.get((name, value.lower()))
    if flag is not None:
        return Term(flag, None, negated)
    if name in ("has", "is"):
        offered = "has:attachment" if name == "has" else "is:read or is:unread"
        raise QueryError(raw, f"{name}: takes {offered}")
    try:
        kind = Kind(name)
    except ValueError:
        # Not a keyword (a URL, a time of day): searched as a word.
        if not _WORDISH.search(body):
            raise QueryError(raw, "no letters or digits to look for") from None
        return Term(Kind.WORD, _unquote(raw, body), negated)
    if not value.strip():
        raise QueryError(raw, f"{name}: needs a value")
    if kind in DATE_KEYS:
        return Term(kind, parse_moment(raw, value), negated)
    if kind is Kind.MESSAGE_ID:
        return Term(kind, normalise_message_id(value), negated)
    return Term(kind, value.strip().lower() if kind is not Kind.SUBJECT else value, negated)


def parse_moment(term: str, value: str) -> datetime:
    """`after:`/`before:`'s value: a date (midnight UTC), an ISO 8601
    timestamp (UTC when it names no offset) or Unix seconds."""
    value = value.strip()
    try:
        if re.fullmatch(r"\d+(\.\d+)?", value):
            return datetime.fromtimestamp(float(value), UTC)
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return datetime.combine(date.fromisoformat(value), time(), UTC)
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):
        raise QueryError(term, "not a date, a timestamp or Unix seconds") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def render(query: InboxQuery) -> str:
    """The query written back in the syntax :func:`parse_query` reads."""
    parts = []
    for t in query.terms:
        sign = "-" if t.negated else ""
        if t.kind in (Kind.HAS_ATTACHMENT, Kind.READ, Kind.UNREAD):
            parts.append(sign + t.kind.value)
        elif t.kind is Kind.WORD:
            parts.append(sign + str(t.value))
        elif t.kind is Kind.PHRASE:
            parts.append(f'{sign}"{t.value}"')
        elif isinstance(t.value, datetime):
            parts.append(f"{sign}{t.kind.value}:{t.value.isoformat()}")
        else:
            parts.append(f'{sign}{t.kind.value}:"{t.value}"')
    return " ".join(parts)
