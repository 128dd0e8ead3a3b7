"""Decide whether a message satisfies a signal, and which message wins (docs/api.md, "Matching").

Pure: criteria and candidates in, a verdict out. The caller loads candidates
(messages seen at the provider for the signal's recipient) and persists the
outcome; nothing here reads a clock or a database.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import NamedTuple

from app.domain.mail import DEFAULT_TEXT_MAX_BYTES, ParsedMail, normalize_whitespace
from app.domain.moments import as_utc

__all__ = [
    "Candidate",
    "Criteria",
    "NearMissPick",
    "Pick",
    "Verdict",
    "Why",
    "evaluate",
    "floor_to",
    "normalize_address",
    "pick",
]


class Why(StrEnum):
    """Why a message addressed to the recipient did not match.

    The declaration order is the order failures are reported in.
    """

    RUN_MARKER_MISMATCH = "run_marker_mismatch"
    RUN_MARKER_MISSING = "run_marker_missing"
    RECEIVED_BEFORE_WINDOW = "received_before_window"
    SUBJECT_MISMATCH = "subject_mismatch"
    BODY_MISMATCH = "body_mismatch"
    TAKEN_BY_OTHER_SIGNAL = "taken_by_other_signal"
    # Passed every other rule but went to an address one or two edits from
    # the recipient (found at expiry, `app.usecases.typos`; never by `evaluate`).
    RECIPIENT_TYPO = "recipient_typo"


@dataclass(frozen=True)
class Criteria:
    """What a signal expects. Naive datetimes are read as UTC.

    ``precision`` is the resolution of the provider's receive stamps (IMAP
    INTERNALDATE and a ``Date:`` header: one second; the sink: exact). A
    message stamped in the same tick as ``received_after`` is inside the
    window: the stamp cannot say it arrived earlier.
    """

    recipient: str
    run_id: str
    received_after: datetime
    subject_contains: str | None = None
    body_contains: str | None = None
    require_run_marker: bool = False
    precision: timedelta = timedelta(0)
    # `body_contains` searches the first this many bytes of the normalised text.
    text_max_bytes: int = DEFAULT_TEXT_MAX_BYTES

    @property
    def window_opens(self) -> datetime:
        """``received_after`` floored to the provider's precision."""
        return floor_to(as_utc(self.received_after), self.precision)


@dataclass(frozen=True)
class Candidate:
    """A message seen at the provider, as matching needs it.

    ``message_id`` is Signalbox's id (``msg_…``). ``envelope_recipients`` are the
    SMTP ``RCPT TO`` addresses when the provider knows them. ``taken_by_other``
    is true when the message is already the message of another signal.
    """

    message_id: str
    received_at: datetime
    mail: ParsedMail
    envelope_recipients: tuple[str, ...] = ()
    taken_by_other: bool = False

    @functools.cached_property
    def addresses(self) -> frozenset[str]:
        """Every address the message went to (envelope, To, Cc), normalised:
        made once per candidate, which a look at a shared address holds up
        to every waiting signal."""
        mail = self.mail
        return frozenset(
            normalize_address(a) for a in (*self.envelope_recipients, *mail.to, *mail.cc)
        )


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one candidate against one signal.

    ``addressed`` says whether the recipient rule holds; ``failures`` lists every
    other rule that failed, in :class:`Why` declaration order (they are computed
    even when the message is not addressed to the recipient).
    """

    addressed: bool
    failures: tuple[Why, ...]

    @property
    def matched(self) -> bool:
        """The message satisfies the signal."""
        return self.addressed and not self.failures

    @property
    def near_miss(self) -> bool:
        """Addressed to the recipient and failed at least one other rule (docs/api.md):
        its `why` is the first failure, `also` the others."""
        return self.addressed and bool(self.failures)


class NearMissPick(NamedTuple):
    """A near miss of a batch: the candidate, its first failed rule and the others."""

    candidate: Candidate
    why: Why
    also: tuple[Why, ...] = ()


@dataclass(frozen=True)
class Pick:
    """The result of matching a batch of candidates.

    ``winner`` is the earliest-received matching candidate (ties broken by
    ``message_id``), or None. ``near_misses`` holds each candidate addressed to
    the recipient that failed a rule, with the first failed rule (in
    :class:`Why` order) and the others, ordered by ``received_at`` then
    ``message_id``.
    """

    winner: Candidate | None
    near_misses: tuple[NearMissPick, ...]


def normalize_address(address: str) -> str:
    """The comparable form of an email address: trimmed, angle brackets removed, lower-cased.

    The whole address is kept, plus-tag included: ``qa+run1@x`` and ``qa@x``
    are different recipients.
    """
    return address.strip().strip("<>").strip().lower()


def evaluate(criteria: Criteria, candidate: Candidate) -> Verdict:
    """Apply every rule of docs/api.md "Matching" to one candidate.

    - recipient: equal, case-insensitively, to an envelope recipient, a To or a Cc address;
    - ``received_at >= received_after`` floored to the provider's precision;
    - run marker: when the message has one it must equal ``run_id`` exactly; with
      ``require_run_marker`` a message without one fails;
    - ``subject_contains``: case-insensitive substring of the decoded subject (both
      sides NFC-normalised and case-folded);
    - ``body_contains``: case-sensitive substring of ``mail.searchable_text()`` (the
      first ``text_max_bytes`` of ``matchable_text()``), both
      sides NFC-normalised and with whitespace runs collapsed, so a needle still
      matches text that the sender hard-wrapped or wrote with CRLF line ends;
    - not already the message of another signal.
    """
    mail = candidate.mail
    wanted = normalize_address(criteria.recipient)
    addressed = bool(wanted) and wanted in candidate.addresses

    failures: list[Why] = []
    marker = mail.run_marker.strip() if mail.run_marker else ""
    if marker and marker != criteria.run_id:
        failures.append(Why.RUN_MARKER_MISMATCH)
    if not marker and criteria.require_run_marker:
        failures.append(Why.RUN_MARKER_MISSING)
    if as_utc(candidate.received_at) < criteria.window_opens:
        failures.append(Why.RECEIVED_BEFORE_WINDOW)
    if criteria.subject_contains is not None and not _contains_folded(
        mail.subject, criteria.subject_contains
    ):
        failures.append(Why.SUBJECT_MISMATCH)
    if criteria.body_contains is not None and _prepare(criteria.body_contains) not in (
        mail.searchable_text(criteria.text_max_bytes)
    ):
        failures.append(Why.BODY_MISMATCH)
    if candidate.taken_by_other:
        failures.append(Why.TAKEN_BY_OTHER_SIGNAL)
    return Verdict(addressed=addressed, failures=tuple(failures))


def pick(criteria: Criteria, candidates: Iterable[Candidate]) -> Pick:
    """Choose the winning message for a signal and collect its near misses.

    The earliest ``received_at`` among matching candidates wins; equal instants
    are broken by ``message_id`` so every worker picks the same message.
    """
    winner: Candidate | None = None
    near: list[NearMissPick] = []
    for candidate in candidates:
        verdict = evaluate(criteria, candidate)
        if verdict.matched:
            if winner is None or _order_key(candidate) < _order_key(winner):
                winner = candidate
        elif verdict.near_miss:
            near.append(NearMissPick(candidate, verdict.failures[0], verdict.failures[1:]))
    near.sort(key=lambda miss: _order_key(miss.candidate))
    return Pick(winner=winner, near_misses=tuple(near))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def floor_to(moment: datetime, precision: timedelta) -> datetime:
    """``moment`` rounded down to a multiple of ``precision`` since the epoch."""
    if precision <= timedelta(0):
        return moment
    return moment - (moment - _EPOCH) % precision


def _order_key(candidate: Candidate) -> tuple[datetime, str]:
    return as_utc(candidate.received_at), candidate.message_id


# A subject or a needle this short is folded once and remembered: a look at
# a shared address compares every waiting signal's needle with the same
# subjects. Longer text is folded each time (the memo's size stays bounded).
_FOLD_MEMO_CHARS = 1000


def _fold(text: str) -> str:
    return _fold_short(text) if len(text) <= _FOLD_MEMO_CHARS else _fold_text(text)


def _fold_text(text: str) -> str:
    # casefold() can produce denormalised sequences, so normalise on both sides of it.
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())


_fold_short = functools.lru_cache(maxsize=4096)(_fold_text)


def _contains_folded(haystack: str, needle: str) -> bool:
    return _fold(needle) in _fold(haystack)


def _prepare(needle: str) -> str:
    """A needle as the searched text is (ParsedMail.searchable_text)."""
    return normalize_whitespace(unicodedata.normalize("NFC", needle))
