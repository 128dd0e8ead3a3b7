"""Repository of API tokens (`api_tokens`): a token's namespace, by its hash."""

from __future__ import annotations

from sqlalchemy import Connection, text


def token_namespace(session: Connection, token_hash: str) -> str | None:
    return session.execute(
        text("SELECT namespace FROM api_tokens WHERE token_hash = :h"), {"h": token_hash}
    ).scalar_one_or_none()


def token_create(session: Connection, namespace: str, token_hash: str) -> None:
    session.execute(
        text("INSERT INTO api_tokens (namespace, token_hash) VALUES (:ns, :h)"),
        {"ns": namespace, "h": token_hash},
    )


def token_hashes_of_namespace(session: Connection, namespace: str) -> list[str]:
    """The stored hashes of a namespace's tokens (`token create`)."""
    return list(
        session.execute(
            text("SELECT token_hash FROM api_tokens WHERE namespace = :ns"), {"ns": namespace}
        ).scalars()
    )


def token_namespaces_some(session: Connection, limit: int) -> list[str]:
    """Up to `limit` distinct namespaces that have stored tokens."""
    return list(
        session.execute(
            text("SELECT DISTINCT namespace FROM api_tokens LIMIT :n"), {"n": limit}
        ).scalars()
    )
