"""Opaque prefixed identifiers and the recipient hash logs and evidence use."""

from __future__ import annotations

import hashlib
import secrets

PREFIXES = frozenset({"sig", "msg", "clm", "mbx", "dlq", "rcp", "chk"})


def new_id(prefix: str) -> str:
    """A fresh opaque id such as `sig_3kq9...` (128 bits of randomness)."""
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    return f"{prefix}_{secrets.token_hex(12)}"


def recipient_hash(address: str) -> str:
    """First 12 hex of SHA-256 of the lower-cased address: safe to log and publish."""
    return hashlib.sha256(address.strip().lower().encode()).hexdigest()[:12]


def token_hash(token: str) -> str:
    """How API tokens are stored: never in clear."""
    return hashlib.sha256(token.encode()).hexdigest()
