"""The Provider protocol: what every mailbox provider implements.

A provider is read with no database lock held. It returns raw RFC 5322 bytes
plus what the provider knows of the envelope; parsing and matching happen in
`app.domain`, never here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Protocol

# What a provider that stamps whole seconds (IMAP INTERNALDATE, a `Date:`
# header) declares as its `timestamp_precision`.
WHOLE_SECONDS = timedelta(seconds=1)


@dataclass(frozen=True)
class SearchQuery:
    """One look at a mailbox on behalf of one or more signals.

    `since` is the earliest `received_after` of those signals, minus a
    slack the caller chooses (near misses before the window are wanted).
    `recipients` are lower-cased addresses; `windows` maps each of them to
    the earliest moment any of its signals wants (its own `since`). A
    provider may use both to narrow its search but must return every
    message to a recipient received at or after that recipient's window,
    however many there are (page through them; never cut at a count).
    """

    since: datetime
    recipients: frozenset[str] = frozenset()
    windows: Mapping[str, datetime] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ProviderMessage:
    """A message as seen at a provider.

    `provider_message_id` is stable across checks (IMAP: UIDVALIDITY:UID;
    MailDev: its id; sink: the row id). `received_at` is the provider's
    receive time in UTC (timezone-aware). `envelope_recipients` are the
    RCPT TO addresses where the provider knows them, lower-cased.

    `recorded_known`: the provider read our own record of the message with
    it (the sink, whose mailbox is our database), and `recorded_id` is our
    id for it in `messages` when a check had recorded it then, else None.
    Other providers cannot tell: recording their messages asks the database.

    `message_id`: the `msg_` id the message was given when it was stored
    (the sink's), which recording it keeps; None: recording makes one up.

    `raw` is None when the provider left the bytes where they are stored
    (the sink: its rows in `sink_messages`, `size` long): a look reads them
    only for a message it must parse, a few at a time
    (`app.usecases.checks.observed`, SIGNALBOX_LOOK_MAX_BYTES).
    """

    provider_message_id: str
    received_at: datetime
    raw: bytes | None
    envelope_recipients: tuple[str, ...] = field(default_factory=tuple)
    recorded_known: bool = False
    recorded_id: str | None = None
    # The namespace whose API token the SMTP sender authenticated with (the
    # sink only): the message is that namespace's alone.
    auth_namespace: str | None = None
    message_id: str | None = None
    size: int | None = None

    @property
    def raw_size(self) -> int:
        """The raw message's length in bytes, read or not."""
        return len(self.raw) if self.raw is not None else int(self.size or 0)


class Provider(Protocol):
    """A configured mailbox provider.

    Errors are raised as `app.errors.ProviderUnavailable` (transient:
    timeouts, refused connections, 5xx, 429 with `retry_after`) or
    `app.errors.ProviderRejected` (permanent: authentication,
    configuration). A garbage answer is a `ProviderUnavailable` with
    `error_code="bad_response"`, never another exception type.
    """

    name: str
    type: str
    # Resolution of `ProviderMessage.received_at`: a message stamped in the
    # same tick as a signal's `received_after` is inside its window.
    timestamp_precision: timedelta
    # True when every arrival is pushed to Signalbox (the sink): scheduled
    # looks are then only the first and the final one.
    pushes: bool

    def search(self, query: SearchQuery) -> Sequence[ProviderMessage]:
        """Messages received at or after `query.since` (oldest first)."""
        ...

    def close(self) -> None:
        """Release connections; the provider may be used again after."""
        ...
