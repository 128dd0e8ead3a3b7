"""Who is calling: a bearer token resolved to a principal.

A token belongs to exactly one namespace (a tenant) or is an operator's
(`SIGNALBOX_OPS_TOKENS`): an operator triages every namespace but never
claims, consumes or reads content (docs/api.md, "Operators").
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from app.db import tokens as tokens_db
from app.db.engine import transaction
from app.domain.ids import token_hash
from app.settings import Settings


@dataclass(frozen=True)
class Principal:
    """A tenant (`namespace` set) or an operator (`operator` set), never both."""

    namespace: str | None = None
    operator: str | None = None

    @property
    def is_ops(self) -> bool:
        return self.operator is not None

    def scope(self, namespace: str | None = None) -> str | None:
        """The namespace a read is limited to: a tenant's own, always; an
        operator's `namespace` filter, or None (every namespace)."""
        return namespace if self.is_ops else self.namespace


def _lookup(table: dict[str, str], token: str) -> str | None:
    # Constant-time comparison against every configured token.
    found = None
    for candidate, owner in table.items():
        if hmac.compare_digest(candidate.encode(), token.encode()):
            found = owner
    return found


def known_principal(settings: Settings, token: str) -> Principal | None:
    """The principal of a configured or recently seen token, without I/O
    (cheap enough for the event loop); None: ask `principal_for_token`."""
    token = token.strip()
    if not token:
        return None
    operator = _lookup(settings.ops_token_map, token)
    if operator is not None:
        return Principal(operator=operator)
    namespace = _lookup(settings.token_map, token) or _cached(token_hash(token))
    return Principal(namespace=namespace) if namespace is not None else None


def principal_for_token(settings: Settings, token: str) -> Principal | None:
    """The principal of `token`, or None when it is not a valid token."""
    known = known_principal(settings, token)
    if known is not None or not token.strip():
        return known
    digest = token_hash(token.strip())
    with transaction() as session:
        namespace = tokens_db.token_namespace(session, digest)
    if namespace is None:
        return None
    _remember(digest, namespace)
    return Principal(namespace=namespace)


# Tokens created with `signalbox-server token create` live in the database;
# a request should not cost a transaction to find its namespace. A known
# token is remembered for TOKEN_CACHE_SECONDS (unknown ones never are, so a
# new token works at once).
TOKEN_CACHE_SECONDS = 30.0
TOKEN_CACHE_ENTRIES = 1024
_tokens: OrderedDict[str, tuple[str, float]] = OrderedDict()
_tokens_lock = threading.Lock()


def _cached(digest: str) -> str | None:
    with _tokens_lock:
        entry = _tokens.get(digest)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]


def _remember(digest: str, namespace: str) -> None:
    with _tokens_lock:
        _tokens[digest] = (namespace, time.monotonic() + TOKEN_CACHE_SECONDS)
        _tokens.move_to_end(digest)
        while len(_tokens) > TOKEN_CACHE_ENTRIES:
            _tokens.popitem(last=False)
