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
