"""Addresses and domains one or two edits from what was meant (docs/api.md,
"Typos"): `new-usre@example.test` for `new-user@example.test`, `gamil.com`
for `gmail.com`.

Pure. An edit is one character inserted, deleted or replaced, or two
neighbours swapped (the optimal-string-alignment Damerau-Levenshtein
distance): a swapped pair, the commonest slip of a typist, counts one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

__all__ = [
    "MAX_EDITS",
    "WELL_KNOWN_DOMAINS",
    "address_edits",
    "domain_suggestion",
    "edit_distance",
]

MAX_EDITS = 2

# Mail domains test fixtures mistype. Every real domain near another one is
# listed too (mail.com beside gmail.com, gmx.de beside gmx.at), so an exact
# real domain is never "corrected" to its neighbour.
WELL_KNOWN_DOMAINS: tuple[str, ...] = (
    "gmail.com",
    "googlemail.com",
    "outlook.com",
    "hotmail.com",
    "live.com",
    "msn.com",
    "yahoo.com",
    "ymail.com",
    "icloud.com",
    "me.com",
    "mac.com",
    "aol.com",
    "proton.me",
    "protonmail.com",
    "pm.me",
    "gmx.com",
    "gmx.de",
    "gmx.net",
    "gmx.at",
    "gmx.ch",
    "gmx.fr",
    "gmx.us",
    "web.de",
    "mail.com",
    "mail.ru",
    "yandex.ru",
    "yandex.com",
    "zoho.com",
    "fastmail.com",
    "hey.com",
    "qq.com",
    "163.com",
    "126.com",
    "hotmail.co.uk",
    "yahoo.co.uk",
    "outlook.fr",
    "hotmail.fr",
    "orange.fr",
    "free.fr",
)


def edit_distance(a: str, b: str, limit: int = MAX_EDITS) -> int:
    """Edits from `a` to `b` (optimal string alignment), or `limit + 1` once
    it is known to exceed `limit`: bounded work on long hostile input."""
    if a == b:
        return 0
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            best = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                best = min(best, previous2[j - 2] + 1)
            current[j] = best
        if min(current) > limit:
            return limit + 1
        previous2, previous = previous, current
    return min(previous[len(b)], limit + 1)


def _split(address: str) -> tuple[str, str] | None:
    local, at, domain = address.strip().lower().rpartition("@")
    if not at or not local or not domain:
        return None
    return local, domain


def address_edits(recipient: str, address: str) -> int | None:
    """1 or 2 when `address` is that many edits from `recipient` in its local
    part or in its domain (the other part equal, case-insensitively); None when
    it is the same address or further away."""
    want, got = _split(recipient), _split(address)
    if want is None or got is None or want == got:
        return None
    if want[1] == got[1]:
        edits = edit_distance(want[0], got[0])
    elif want[0] == got[0]:
        edits = edit_distance(want[1], got[1])
    else:
        return None
    return edits if 1 <= edits <= MAX_EDITS else None


def domain_suggestion(recipient: str, known: Iterable[str]) -> str | None:
    """The domain of `known` that the recipient's domain is one or two edits
    from (the nearest; ties by the order of `known`), or None: also when the
    domain is one of `known` exactly."""
    parts = _split(recipient)
    if parts is None:
        return None
    return _nearest_domain(parts[1], tuple(k.strip().lower() for k in known if k.strip()))


# Every create asks about its recipient's domain: a test suite uses a handful
# of domains, so the answer is remembered (bounded; a hostile caller with many
# domains only evicts).
@functools.lru_cache(maxsize=1024)
def _nearest_domain(domain: str, candidates: tuple[str, ...]) -> str | None:
    if domain in candidates:
        return None
    best: tuple[int, str] | None = None
    for candidate in candidates:
        edits = edit_distance(domain, candidate)
        if 1 <= edits <= MAX_EDITS and (best is None or edits < best[0]):
            best = (edits, candidate)
    return best[1] if best else None
