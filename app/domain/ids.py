"""Opaque prefixed identifiers and the recipient hash logs and evidence use."""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIXES = frozenset({"sig", "msg", "clm", "mbx", "dlq", "rcp", "chk", "chs"})


def new_id(prefix: str) -> str:
    """A fresh opaque id such as `sig_3kq9...` (128 bits of randomness)."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    return f"{prefix}_{secrets.token_hex(12)}"


def recipient_hash(address: str, key: bytes) -> str:
    """First 12 hex of HMAC-SHA256, keyed with the deployment's ``key``, of the
    stripped, lower-cased address: safe to log and publish. Keyed, because a
    plain hash of a guessable address is looked up by hashing guesses."""
    digest = hmac.new(key, address.strip().lower().encode(), hashlib.sha256)
    return digest.hexdigest()[:12]


def token_hash(token: str) -> str:
    """How API tokens are stored: never in clear."""
    return hashlib.sha256(token.encode()).hexdigest()
