"""Console sessions: a signed, HTTP-only cookie that names the principal
(never the token), and CSRF tokens bound to it. Signing out records the
session id as revoked in PostgreSQL (`app.usecases.auth`), so a copy of the
cookie stops working on every replica.

The signing key is SIGNALBOX_CONSOLE_SECRET, or else a random key created
once in SIGNALBOX_DATA_DIR (mode 0600). Several API replicas must share the
setting: each would otherwise sign with its own key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from app.infra.keys import kept_key
from app.settings import Settings
from app.usecases.auth import Principal

SESSION_COOKIE = "signalbox_console"
LOGIN_COOKIE = "signalbox_console_login"
SECRET_FILE = "console-secret"


def secret_key(settings: Settings) -> bytes:
    """The signing key: the setting, else one kept in the data directory."""
    if settings.console_secret:
        return settings.console_secret.encode()
    return kept_key(settings, SECRET_FILE, "SIGNALBOX_CONSOLE_SECRET")


def _sign(key: bytes, value: bytes) -> str:
    return hmac.new(key, value, hashlib.sha256).hexdigest()


def _same(expected: str, given: str) -> bool:
    """Constant-time equality of a MAC and what a client sent, which may be
    anything: `hmac.compare_digest` raises on a non-ASCII `str`, so a value
    that is not ASCII (never a MAC) is simply not equal."""
    return given.isascii() and hmac.compare_digest(expected.encode(), given.encode())


def fingerprint(key: bytes, token_hash: str) -> str:
    """What the cookie keeps of the token: a keyed hash of its stored hash."""
    return _sign(key, b"token:" + token_hash.encode())[:32]


@dataclass(frozen=True)
class Session:
    principal: Principal
    fingerprint: str
    sid: str
    expires: float


def encode(key: bytes, session: Session) -> str:
    p = session.principal
    body = {
        "k": "ops" if p.is_ops else "ns",
        "n": p.operator if p.is_ops else p.namespace,
        "f": session.fingerprint,
        "s": session.sid,
        "e": int(session.expires),
    }
    raw = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode())
    return raw.decode().rstrip("=") + "." + _sign(key, raw.rstrip(b"="))


def decode(key: bytes, cookie: str | None, now: float | None = None) -> Session | None:
    """The session in a cookie, if its signature holds and it has not expired."""
    if not cookie or "." not in cookie or len(cookie) > 4096:
        return None
    raw, _, mac = cookie.rpartition(".")
    if not _same(_sign(key, raw.encode()), mac):
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        kind, name = body["k"], str(body["n"])
        session = Session(
            principal=Principal(operator=name) if kind == "ops" else Principal(namespace=name),
            fingerprint=str(body["f"]),
            sid=str(body["s"]),
            expires=float(body["e"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    return session if session.expires > (now or time.time()) else None


def new_session(key: bytes, principal: Principal, token_hash: str, hours: float) -> Session:
    return Session(
        principal=principal,
        fingerprint=fingerprint(key, token_hash),
        sid=secrets.token_urlsafe(16),
        expires=time.time() + hours * 3600,
    )


def csrf_token(key: bytes, sid: str) -> str:
    """The hidden form field bound to one session (or one login page)."""
    return _sign(key, b"csrf:" + sid.encode())


def csrf_valid(key: bytes, sid: str | None, submitted: object) -> bool:
    """Whether `submitted` is the CSRF token of `sid`; any other value
    (missing, malformed, not ASCII) is False, never an error."""
    if not sid or not isinstance(submitted, str) or not submitted:
        return False
    return sid.isascii() and _same(csrf_token(key, sid), submitted)
