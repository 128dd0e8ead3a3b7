"""Chaos on the sink (docs/api.md, "Chaos"): which rule answers an SMTP
command instead of the sink, and what a valid reply is.

Pure: rules and a recipient in, the rule that applies out. Counting a rule
as applied is the repository's (one guarded update, shared by every sink
process); the random draw of a probability rule is the caller's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

__all__ = [
    "ChaosRule",
    "ChaosStage",
    "data_rules_at_rcpt",
    "data_rules_whole",
    "is_valid_reply",
    "pattern_matches",
    "rules_for",
]


class ChaosStage(StrEnum):
    """The SMTP command a rule answers."""

    RCPT = "rcpt"
    DATA = "data"


# A reply the sink can send in place of its own: a 4xx or 5xx code (second
# digit 0-5, RFC 5321 §4.2), an optional enhanced status code of the same
# class (RFC 3463), then text; one line of printable ASCII, at most 512
# characters with its CRLF.
_REPLY_RE = re.compile(r"([45][0-5][0-9])(?: ([45])\.[0-9]{1,3}\.[0-9]{1,3}(?= |\Z))?(?: [ -~]*)?")
REPLY_MAX = 510


def is_valid_reply(reply: str) -> bool:
    """Whether `reply` is one valid 4xx/5xx SMTP reply line (no CR or LF)."""
    if len(reply) > REPLY_MAX:
        return False
    match = _REPLY_RE.fullmatch(reply)
    if match is None:
        return False
    enhanced_class = match.group(2)
    return enhanced_class is None or enhanced_class == reply[0]


@dataclass(frozen=True)
class ChaosRule:
    """A rule as the sink holds it. `recipient` is a lower-cased address or
    `*@domain`; `exhausted` is true once its `times` are used up."""

    rule_id: str
    recipient: str
    stage: ChaosStage
    reply: str
    expires_at: datetime
    times: int | None = None
    probability: float | None = None
    exhausted: bool = False
    # The namespace that set it ("": unknown, then it covers only its own pattern).
    namespace: str = ""


def pattern_matches(pattern: str, address: str) -> bool:
    """Whether the rule's `pattern` (an address or `*@domain`) covers `address`."""
    address = address.strip().strip("<>").lower()
    if pattern.startswith("*@"):
        return address.rpartition("@")[2] == pattern[2:]
    return address == pattern


def rules_for(
    rules: Iterable[ChaosRule], stage: ChaosStage, addresses: Sequence[str], now: datetime
) -> list[ChaosRule]:
    """The live rules of `stage` that cover any of `addresses`, in their order."""
    return [
        r
        for r in rules
        if r.stage is stage
        and not r.exhausted
        and r.expires_at > now
        and any(pattern_matches(r.recipient, a) for a in addresses)
    ]


def _namespaces(rules: Iterable[ChaosRule], address: str, now: datetime) -> set[str]:
    """The namespaces with a live rule (of any stage) covering `address`: a
    namespace sets rules only on addresses it owns or holds, so they are its."""
    return {
        r.namespace for r in rules if r.expires_at > now and pattern_matches(r.recipient, address)
    }


def _whole(
    rules: Sequence[ChaosRule], rule: ChaosRule, addresses: Sequence[str], now: datetime
) -> bool:
    return all(rule.namespace in _namespaces(rules, a, now) for a in addresses)


def data_rules_whole(
    rules: Sequence[ChaosRule], addresses: Sequence[str], now: datetime
) -> list[ChaosRule]:
    """The live DATA rules covering one of `addresses` that may refuse the
    whole transaction: every recipient is their namespace's. One namespace's
    rule never refuses mail that also goes to another tenant's recipients."""
    return [
        r
        for r in rules_for(rules, ChaosStage.DATA, addresses, now)
        if _whole(rules, r, addresses, now)
    ]


def data_rules_at_rcpt(
    rules: Sequence[ChaosRule], address: str, earlier: Sequence[str], now: datetime
) -> list[ChaosRule]:
    """The live DATA rules covering `address` that act at its RCPT instead,
    for their own recipient: the transaction already carries a recipient
    that is not their namespace's (`earlier`: the recipients accepted so far)."""
    return [
        r
        for r in rules_for(rules, ChaosStage.DATA, [address], now)
        if not _whole(rules, r, [*earlier, address], now)
    ]
