"""Messages a provider showed a check: parsed once per process, recorded
once in the database."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

from sqlalchemy import Connection

from app.db import messages as messages_db
from app.db import sink_messages as sink_messages_db
from app.db.engine import autocommit
from app.domain.ids import new_id
from app.domain.inbox_query import normalise_message_id
from app.domain.mail import ParsedMail
from app.domain.mail.bounds import has_bare_lf
from app.domain.mail.parsed import HTML_MARKUP_FACTOR
from app.domain.whole_message import attachment_count
from app.infra.parse_budget import parse_on_budget
from app.providers.base import ProviderMessage
from app.settings import get_settings


class Observed(NamedTuple):
    """A recorded message: our id, what the provider gave, and its parse;
    `recorded_now`: the call that returned it recorded it, in the caller's
    transaction (no one else knows its id before that commits, so no signal
    has the message yet)."""

    message_id: str
    message: ProviderMessage
    mail: ParsedMail
    recorded_now: bool = False

    @property
    def delivered_to(self) -> list[str]:
        """The recipients it was delivered to: the envelope's where the
        provider knows them (the sink), else To and Cc. Who may see it
        follows these (`app.usecases.visibility`), never a header the
        sender wrote beside the envelope."""
        return delivered_to(self.message, self.mail)


def delivered_to(message: ProviderMessage, mail: ParsedMail) -> list[str]:
    if message.envelope_recipients:
        return sorted({a.lower() for a in message.envelope_recipients})
    return sorted({a.lower() for a in (*mail.to, *mail.cc)})


class _Facts(NamedTuple):
    """What a look keeps of a parsed message: the parse with its text cut to
    what matching reads (`slim`), whether a line ended in a bare LF, and the
    inbox's columns (`inbox_columns`): all a recording needs, without the raw."""

    mail: ParsedMail
    bare_lf: bool
    bytes: int
    inbox: dict[str, object]


# Parsed messages this process remembers, bounded by their size (not their
# number): a 23 MiB text part is kept as the first
# SIGNALBOX_MATCH_TEXT_MAX_BYTES that matching reads, never whole.
PARSED_CACHE_MAX_BYTES = 64 * 1024 * 1024
_PARSED: OrderedDict[tuple[str, str], _Facts] = OrderedDict()
_parsed_bytes = 0
_PARSED_LOCK = threading.Lock()


# Messages this process's looks recorded, once their transaction committed
# (provider, provider message id): the sink's inbox record after a push does
# not send them again (their bytes, an insert that finds them, a read of
# their ids). Bounded by number: a message let go is only recorded again,
# by an insert that then finds it.
RECORDED_MEMORY = 4096
_RECORDED: OrderedDict[tuple[str, str], None] = OrderedDict()
_RECORDED_LOCK = threading.Lock()


def note_recorded(recorded: Iterable[tuple[str, str]]) -> None:
    """Remember that (provider, provider message id) pairs are recorded:
    called once the transaction that recorded them committed."""
    with _RECORDED_LOCK:
        for key in recorded:
            _RECORDED[key] = None
            _RECORDED.move_to_end(key)
        while len(_RECORDED) > RECORDED_MEMORY:
            _RECORDED.popitem(last=False)


def recorded_here(provider: str, provider_message_id: str) -> bool:
    """Whether a look in this process recorded the message (committed)."""
    with _RECORDED_LOCK:
        return (provider, provider_message_id) in _RECORDED


class Parser(Protocol):
    """Parses one message's bytes: `parse_mail`, or a parse pool's. A worker
    parses in its own main thread, where parse_mail's CPU budget applies; the
    sink and the API, whose checks run in threads beside their event loops,
    parse in a parse pool (a message of at most 16 KiB in the check's own
    thread: app/infra/parse_pool.py). The check runner is given its parser."""

    def __call__(self, raw: bytes, /) -> ParsedMail: ...


def slim(mail: ParsedMail, text_max_bytes: int) -> ParsedMail:
    """`mail` with only what a look reads: its text and HTML cut to what
    `searchable_text(text_max_bytes)` looks at, that text made once."""
    searchable = mail.searchable_text(text_max_bytes)
    kept = replace(
        mail,
        text=mail.text[:text_max_bytes],
        html=mail.html[: HTML_MARKUP_FACTOR * text_max_bytes],
    )
    kept.__dict__["_searchable"] = {text_max_bytes: searchable}
    return kept


def _size_of(mail: ParsedMail) -> int:
    searchable = sum(sys.getsizeof(t) for t in mail.__dict__.get("_searchable", {}).values())
    addresses = sum(len(a) for a in (*mail.to, *mail.cc))
    return (
        sys.getsizeof(mail.text) + sys.getsizeof(mail.html) + sys.getsizeof(mail.subject)
        + searchable + addresses + 1024
    )  # fmt: skip


def _cached(provider: str, message_id: str) -> _Facts | None:
    with _PARSED_LOCK:
        facts = _PARSED.get((provider, message_id))
        if facts is not None:
            _PARSED.move_to_end((provider, message_id))
        return facts


def _remember(provider: str, message_id: str, facts: _Facts) -> None:
    global _parsed_bytes
    if facts.bytes > PARSED_CACHE_MAX_BYTES // 4:
        return  # one message never crowds out the rest
    with _PARSED_LOCK:
        old = _PARSED.pop((provider, message_id), None)
        if old is not None:
            _parsed_bytes -= old.bytes
        _PARSED[(provider, message_id)] = facts
        _parsed_bytes += facts.bytes
        while _parsed_bytes > PARSED_CACHE_MAX_BYTES and _PARSED:
            _, dropped = _PARSED.popitem(last=False)
            _parsed_bytes -= dropped.bytes


def _facts_of(
    provider: str, message_id: str, raw: bytes, text_max_bytes: int, parse: Parser
) -> _Facts:
    """`parse`, remembered per (provider, message id): a message never
    changes under its id, and every check of a mailbox sees it again."""
    whole = parse(raw)
    inbox = inbox_columns(raw, whole)
    # The words (up to 256 KiB of text) and the addresses kept for the inbox.
    words = sys.getsizeof(inbox["words"]) + 64 * (len(whole.to) + len(whole.cc))
    mail = slim(whole, text_max_bytes)
    del whole
    facts = _Facts(mail, has_bare_lf(raw), _size_of(mail) + words, inbox)
    _remember(provider, message_id, facts)
    return facts


def _limits() -> tuple[int, int]:
    settings = get_settings()
    return settings.look_max_bytes, settings.match_text_max_bytes


def _batches(
    provider: str, messages: Sequence[ProviderMessage], max_bytes: int
) -> Iterator[list[ProviderMessage]]:
    """`messages` in order, cut so that the raw bytes a batch must read (of
    messages not parsed yet) stay within `max_bytes` (a larger message goes
    alone)."""
    batch: list[ProviderMessage] = []
    size = 0
    for m in messages:
        cost = m.raw_size if _needs_raw(provider, m) else 0
        if batch and size + cost > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(m)
        size += cost
    if batch:
        yield batch


def _needs_raw(provider: str, m: ProviderMessage) -> bool:
    """Whether the look must read the message's bytes: only to parse it. A
    new message is recorded with its bytes without reading them: the sink's
    are copied in the database, another provider's are in hand already."""
    return _cached(provider, m.provider_message_id) is None


# Reads the raw bytes of messages (provider message ids) left stored.
RawReader = Callable[[Connection, list[str]], dict[str, bytes]]


def sink_raws(session: Connection, ids: list[str]) -> dict[str, bytes]:
    """The sink's stored bytes, by provider message id (its row id)."""
    found = sink_messages_db.sink_message_raws(session, [int(i) for i in ids])
    return {str(k): v for k, v in found.items()}


def _raws(
    session: Connection, read: RawReader, provider: str, batch: list[ProviderMessage]
) -> dict[str, bytes]:
    """The raw bytes of the batch's messages that must be parsed, read in
    one statement when the provider left them stored (the sink)."""
    wanted = [m.provider_message_id for m in batch if m.raw is None and _needs_raw(provider, m)]
    return read(session, wanted) if wanted else {}


def prepare_messages(
    provider: str, messages: Sequence[ProviderMessage], parse: Parser = parse_on_budget
) -> None:
    """Parse what a look's answer holds that this process has not parsed,
    before the check's transaction: the sink's bytes are read a batch of at
    most SIGNALBOX_LOOK_MAX_BYTES at a time, each parsed once and dropped;
    what the transaction then needs is in the cache (it reads again only
    what the cache let go)."""
    max_bytes, text_max_bytes = _limits()
    for batch in _batches(provider, messages, max_bytes):
        if not any(_cached(provider, m.provider_message_id) is None for m in batch):
            continue
        with autocommit() as session:  # reads only
            raws = _raws(session, sink_raws, provider, batch)
        for m in batch:
            raw = m.raw if m.raw is not None else raws.pop(m.provider_message_id, None)
            if raw is not None and _cached(provider, m.provider_message_id) is None:
                _facts_of(provider, m.provider_message_id, raw, text_max_bytes, parse)
            del raw


def forget_parsed() -> None:
    """Forget every remembered parse and recorded message. A message id is
    unique within one database: a process that moves to another (a test's
    own database) must not take its messages for the earlier one's."""
    global _parsed_bytes
    with _PARSED_LOCK:
        _PARSED.clear()
        _parsed_bytes = 0
    with _RECORDED_LOCK:
        _RECORDED.clear()


# Text the inbox's free words are looked up in: the subject and the first
# 256 KiB of the text (a tsvector holds at most 1 MiB).
WORDS_MAX_BYTES = 256 * 1024


def inbox_columns(raw: bytes, mail: ParsedMail) -> dict[str, object]:
    """What the inbox lists and searches a message by (`messages` columns)."""
    return {
        "from_addr": mail.from_addr,
        "to_addrs": list(mail.to),
        "cc_addrs": list(mail.cc),
        "header_message_id": normalise_message_id(mail.message_id_header),
        "attachments": attachment_count(raw),
        "words": mail.subject + "\n" + mail.searchable_text(WORDS_MAX_BYTES),
    }


def record_messages(
    session: Connection,
    provider: str,
    messages: Sequence[ProviderMessage],
    read: RawReader = sink_raws,
    parse: Parser = parse_on_budget,
) -> list[Observed]:
    """Record each observed message once; return every one with our id.
    Whether a message is recorded already is asked of the database unless
    the provider's answer told (`ProviderMessage.recorded_known`).

    Raw bytes are read (with `read`: the sink's, in this transaction) only for messages
    the cache does not hold, at most SIGNALBOX_LOOK_MAX_BYTES at a time; a
    new sink message's bytes are copied in the database. What is returned
    holds no raw bytes (`Observed.message.raw` is None)."""
    if not messages:
        return []
    max_bytes, text_max_bytes = _limits()
    observed: list[Observed] = []
    for batch in _batches(provider, messages, max_bytes):
        raws = _raws(session, read, provider, batch)
        # (message, its facts, our id for it, the bytes the provider gave)
        parsed: list[tuple[ProviderMessage, _Facts, str, bytes | None]] = []
        for m in batch:
            raw = m.raw if m.raw is not None else raws.pop(m.provider_message_id, None)
            facts = _cached(provider, m.provider_message_id)
            if facts is None:
                if raw is None:  # the cache let it go since the batch was cut
                    raw = read(session, [m.provider_message_id]).get(m.provider_message_id)
                if raw is None:
                    continue  # purged since the look: nothing to record or match
                facts = _facts_of(provider, m.provider_message_id, raw, text_max_bytes, parse)
            parsed.append((m, facts, m.message_id or new_id("msg"), m.raw))
            raw = None
        del raws
        recorded: set[str] = set()
        ids = messages_db.message_record_new(
            session,
            provider,
            [
                {
                    "id": our_id,
                    "provider": provider,
                    "provider_message_id": m.provider_message_id,
                    "received_at": m.received_at,
                    "subject": f.mail.subject,
                    "recipients": sorted(
                        {a.lower() for a in (*m.envelope_recipients, *f.mail.to, *f.mail.cc)}
                    ),
                    "delivered_to": delivered_to(m, f.mail),
                    "run_marker": f.mail.run_marker,
                    "size": m.raw_size,
                    "bare_lf": f.bare_lf,
                    "auth_namespace": m.auth_namespace,
                    "raw": given,
                    # The sink's bytes stay where they are: the insert copies them.
                    "sink_id": int(m.provider_message_id) if given is None else None,
                    **f.inbox,
                }
                for m, f, our_id, given in parsed
            ],
            known={m.provider_message_id: m.recorded_id for m in batch if m.recorded_known},
            recorded=recorded,
        )
        # Recorded now only if this call's insert recorded it: a sink
        # message the sink recorded at its 250 has the same id.
        observed += [
            Observed(
                ids[m.provider_message_id],
                replace(m, raw=None, size=m.raw_size),
                f.mail,
                m.provider_message_id in recorded,
            )
            for m, f, our_id, _ in parsed
            if m.provider_message_id in ids
        ]
        del parsed
    return observed
