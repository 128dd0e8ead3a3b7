"""The providers file: which mailbox providers exist, by name, and how to build them.

The file (``SIGNALBOX_PROVIDERS_FILE``, ``config/providers.toml``) holds one
table per provider::

    [providers.corp-imap]
    type = "imap"
    host = "imap.example.com"
    port = 993
    tls = true
    username = "qa@example.com"
    password_env = "CORP_IMAP_PASSWORD"
    folder = "INBOX"

    [providers.catcher]
    type = "maildev"
    url = "http://127.0.0.1:1080"

Secrets are named, never written: a literal ``password`` is refused, and the
variable named by ``password_env`` must be set when the file is loaded, so a
missing secret fails at start-up rather than at the first check. The
resolved password is never stored in a `ProviderConfig` (which is logged and
repr'd freely); `build_provider` reads it from the environment again.

The ``sink`` provider (the built-in SMTP sink) always exists, file or not.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from app.errors import ConfigurationError
from app.providers.base import Provider

SINK = "sink"

# Provider names appear in URLs (/v1/inbound/{provider}), metric labels and
# Redis keys: keep them to a safe alphabet.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Keys that would hold a secret in clear text. `password` is the contract's
# rule; the others are the same mistake under another name.
_LITERAL_SECRET_KEYS = frozenset({"password", "passwd", "secret", "token", "api_key"})


@dataclass(frozen=True)
class ProviderConfig:
    """One configured provider: its name, its type and its options as written.

    `options` never holds a secret, only the name of the variable that does
    (``password_env``).
    """

    name: str
    type: str
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    # The namespaces that may use it (`namespaces = [...]`); None: every one.
    namespaces: frozenset[str] | None = None


def load_providers(path: Path | None, environ: Mapping[str, str]) -> dict[str, ProviderConfig]:
    """Read the providers file at `path` (None: no file) and return the providers by name.

    Raises `ConfigurationError`, naming the file, the provider and the key or
    variable at fault, when the file is missing or invalid TOML, a provider
    has an unknown type, a missing or mistyped option, a literal password,
    or names in ``password_env`` a variable absent from `environ`.
    """
    providers: dict[str, ProviderConfig] = {SINK: ProviderConfig(SINK, SINK)}
    if path is None:
        return providers
    document = _read_toml(path)
    unknown_top = sorted(set(document) - {"providers"})
    if unknown_top:
        raise ConfigurationError(
            f"{path}: unknown top-level key(s) {', '.join(unknown_top)}; "
            "providers go in [providers.NAME] tables"
        )
    tables = document.get("providers", {})
    if not isinstance(tables, dict):
        raise ConfigurationError(f"{path}: 'providers' must be a table of [providers.NAME]")
    for name, table in tables.items():
        providers[name] = _parse_provider(path, name, table, environ)
    return providers


def build_provider(config: ProviderConfig, environ: Mapping[str, str]) -> Provider:
    """Make the provider object that `config` describes.

    The password of an IMAP or MailDev provider is read here from the
    variable named by ``password_env``. Raises `ConfigurationError` for an
    unknown type or a variable that is not set.
    """
    builder = _BUILDERS.get(config.type)
    if builder is None:
        raise ConfigurationError(
            f"provider {config.name!r}: unknown type {config.type!r} "
            f"(known: {', '.join(sorted(_BUILDERS))})"
        )
    return builder(config, environ)


# -- reading the file ------------------------------------------------------------


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigurationError(
            f"providers file {path} does not exist (SIGNALBOX_PROVIDERS_FILE)"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f"providers file {path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"providers file {path} is not valid TOML: {exc}") from None


def _parse_provider(
    path: Path, name: str, table: object, environ: Mapping[str, str]
) -> ProviderConfig:
    where = f"{path}: provider {name!r}"
    if not _NAME_RE.fullmatch(name):
        raise ConfigurationError(
            f"{where}: the name must be 1-64 characters of letters, digits, '.', '_' or '-'"
        )
    if not isinstance(table, dict):
        raise ConfigurationError(f"{where}: must be a table ([providers.{name}])")
    # Checked before anything else so that no later error message, and no
    # ProviderConfig, can carry the secret.
    secrets = sorted(key for key in table if key.lower() in _LITERAL_SECRET_KEYS)
    if secrets:
        raise ConfigurationError(
            f"{where}: a literal {secrets[0]!r} is not allowed in the providers file; "
            "put the secret in an environment variable and name it with password_env"
        )
    kind = table.get("type")
    if not isinstance(kind, str):
        raise ConfigurationError(f"{where}: 'type' is required (one of {_known_types()})")
    if name == SINK and kind != SINK:
        raise ConfigurationError(f"{where}: the name 'sink' is reserved for the built-in sink")
    schema = _SCHEMAS.get(kind)
    if schema is None:
        raise ConfigurationError(f"{where}: unknown type {kind!r} (one of {_known_types()})")
    namespaces = _namespaces(where, table.get("namespaces"))
    options = {key: value for key, value in table.items() if key not in ("type", "namespaces")}
    if schema is not _PASSTHROUGH:
        options = _validate(where, options, schema)
    password_env = options.get("password_env")
    if password_env is not None:
        _require_env(where, password_env, environ)
    return ProviderConfig(
        name=name, type=kind, options=MappingProxyType(options), namespaces=namespaces
    )


def _namespaces(where: str, value: object) -> frozenset[str] | None:
    """`namespaces = ["team-a", …]`: a non-empty list of namespace names, or absent."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v.strip() for v in value)
    ):
        raise ConfigurationError(
            f"{where}: 'namespaces' must be a non-empty list of namespace names,"
            ' e.g. namespaces = ["team-a"]'
        )
    return frozenset(v.strip() for v in value)


def _known_types() -> str:
    return ", ".join(sorted(_SCHEMAS))


# -- option schemas ----------------------------------------------------------------


@dataclass(frozen=True)
class _Option:
    kind: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    check: Callable[[Any], str | None] | None = None


def _positive(value: Any) -> str | None:
    return None if value > 0 and math.isfinite(value) else "must be a positive number"


def _port(value: Any) -> str | None:
    return None if 1 <= value <= 65535 else "must be a port number (1-65535)"


def _non_empty(value: Any) -> str | None:
    return None if value.strip() else "must not be empty"


def _http_url(value: Any) -> str | None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "must be an http:// or https:// URL"
    if parts.username or parts.password:
        return "must not carry credentials; use username and password_env"
    return None


def _env_name(value: Any) -> str | None:
    return None if _ENV_NAME_RE.fullmatch(value) else "must be an environment variable name"


_IMAP_SCHEMA: Mapping[str, _Option] = {
    "host": _Option(str, required=True, check=_non_empty),
    "port": _Option(int, check=_port),
    "tls": _Option(bool, default=True),
    "username": _Option(str, required=True, check=_non_empty),
    "password_env": _Option(str, required=True, check=_env_name),
    "folder": _Option(str, default="INBOX", check=_non_empty),
    "timeout": _Option((int, float), default=10.0, check=_positive),
}

_MAILDEV_SCHEMA: Mapping[str, _Option] = {
    "url": _Option(str, required=True, check=_http_url),
    "timeout": _Option((int, float), default=5.0, check=_positive),
    "username": _Option(str, check=_non_empty),
    "password_env": _Option(str, check=_env_name),
}

# The sink's options belong to its own module; they are handed over untouched.
_PASSTHROUGH: Mapping[str, _Option] = MappingProxyType({})

_SCHEMAS: Mapping[str, Mapping[str, _Option]] = {
    SINK: _PASSTHROUGH,
    "imap": _IMAP_SCHEMA,
    "maildev": _MAILDEV_SCHEMA,
}


def _validate(where: str, options: dict[str, Any], schema: Mapping[str, _Option]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(schema))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)} (allowed: {', '.join(schema)})"
        )
    result: dict[str, Any] = {}
    for key, option in schema.items():
        if key not in options:
            if option.required:
                raise ConfigurationError(f"{where}: {key!r} is required")
            if option.default is not None:
                result[key] = option.default
            continue
        value = options[key]
        # bool is an int in Python; `port = true` must not pass as port 1.
        if not isinstance(value, option.kind) or (
            isinstance(value, bool) and option.kind is not bool
        ):
            raise ConfigurationError(
                f"{where}: {key!r} has the wrong type ({type(value).__name__})"
            )
        problem = option.check(value) if option.check else None
        if problem:
            raise ConfigurationError(f"{where}: {key!r} {problem}")
        result[key] = value
    # Half a credential is a typo, not a choice: say so now, not at the first 401.
    if ("username" in result) != ("password_env" in result):
        raise ConfigurationError(f"{where}: 'username' and 'password_env' go together")
    return result


def _require_env(where: str, variable: str, environ: Mapping[str, str]) -> str:
    value = environ.get(variable)
    if value is None:
        raise ConfigurationError(
            f"{where}: environment variable {variable} (named by password_env) is not set",
            variable=variable,
        )
    return value


# -- builders -----------------------------------------------------------------------


def _build_sink(config: ProviderConfig, environ: Mapping[str, str]) -> Provider:
    # Imported here: the sink needs the database layer, which the other
    # providers (and the loader's unit tests) must not drag in.
    from app.providers.sink import SinkProvider

    return SinkProvider(name=config.name, **dict(config.options))


def _build_imap(config: ProviderConfig, environ: Mapping[str, str]) -> Provider:
    from app.providers.imap import ImapProvider

    options = config.options
    where = f"provider {config.name!r}"
    tls = bool(options.get("tls", True))
    return ImapProvider(
        name=config.name,
        host=options["host"],
        port=int(options.get("port") or (993 if tls else 143)),
        tls=tls,
        username=options["username"],
        password=_require_env(where, options["password_env"], environ),
        folder=options.get("folder", "INBOX"),
        timeout=float(options.get("timeout", 10.0)),
    )


def _build_maildev(config: ProviderConfig, environ: Mapping[str, str]) -> Provider:
    from app.providers.maildev import MaildevProvider

    options = config.options
    password_env = options.get("password_env")
    password = (
        _require_env(f"provider {config.name!r}", password_env, environ) if password_env else None
    )
    return MaildevProvider(
        name=config.name,
        url=options["url"],
        timeout=float(options.get("timeout", 5.0)),
        username=options.get("username"),
        password=password,
    )


_BUILDERS: Mapping[str, Callable[[ProviderConfig, Mapping[str, str]], Provider]] = {
    SINK: _build_sink,
    "imap": _build_imap,
    "maildev": _build_maildev,
}
