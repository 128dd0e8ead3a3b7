"""Repository of API tokens (`api_tokens`): a token's namespace, by its hash."""

from __future__ import annotations

from sqlalchemy import Connection

from app.db import runner
from app.db.records import NamespaceRow
from app.db.runner import Statement

_NAMESPACE: Statement[NamespaceRow] = Statement(
    "token_namespace", "SELECT namespace FROM api_tokens WHERE token_hash = :h"
)
_CREATE: Statement = Statement(
    "token_create", "INSERT INTO api_tokens (namespace, token_hash) VALUES (:ns, :h)"
)
_HASHES: Statement = Statement(
    "token_hashes_of_namespace", "SELECT token_hash FROM api_tokens WHERE namespace = :ns"
)
_NAMESPACES: Statement[NamespaceRow] = Statement(
    "token_namespaces_some", "SELECT DISTINCT namespace FROM api_tokens LIMIT :n"
)


def token_namespace(session: Connection, token_hash: str) -> str | None:
    row = runner.one(session, _NAMESPACE, {"h": token_hash})
    return None if row is None else row["namespace"]


def token_create(session: Connection, namespace: str, token_hash: str) -> None:
    runner.exec(session, _CREATE, {"ns": namespace, "h": token_hash})


def token_hashes_of_namespace(session: Connection, namespace: str) -> list[str]:
    """The stored hashes of a namespace's tokens (`token create`)."""
    return [r["token_hash"] for r in runner.all(session, _HASHES, {"ns": namespace})]


def token_namespaces_some(session: Connection, limit: int) -> list[str]:
    """Up to `limit` distinct namespaces that have stored tokens."""
    return [r["namespace"] for r in runner.all(session, _NAMESPACES, {"n": limit})]
