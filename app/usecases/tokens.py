"""API tokens kept in the database (`signalbox-server token create`, and the
development token of `up`). Only a token's hash is stored: the token itself
is shown once, by the caller, and cannot be read back."""

from __future__ import annotations

import secrets

from app.db import tokens as tokens_db
from app.db.engine import transaction
from app.domain.ids import token_hash


def create(namespace: str) -> str:
    """A new token of `namespace`."""
    token = "sbx_" + secrets.token_urlsafe(32)
    with transaction() as session:
        tokens_db.token_create(session, namespace, token_hash(token))
    return token


def dev_token(namespace: str, kept: str) -> str:
    """`kept` while the database still knows it (a token from an earlier run),
    else a new development token of `namespace`."""
    with transaction() as session:
        if kept and tokens_db.token_namespace(session, token_hash(kept)) is not None:
            return kept
        token = "sbx_dev_" + secrets.token_urlsafe(24)
        tokens_db.token_create(session, namespace, token_hash(token))
    return token
