"""All settings in one place: `SIGNALBOX_*` environment variables over `config/*.toml`.

Validated at start-up; a wrong value fails fast naming its variable.
"""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from app.errors import ConfigurationError

CONFIG_FILE_ENV = "SIGNALBOX_CONFIG_FILE"
DEFAULT_CONFIG_FILE = Path("config/signalbox.toml")


class Settings(BaseSettings):
    """Signalbox settings. Every field is `SIGNALBOX_<FIELD>` in the environment."""

    model_config = SettingsConfigDict(
        env_prefix="SIGNALBOX_", extra="ignore", frozen=True, validate_default=True
    )

    database_url: str | None = None
    broker_url: str | None = None
    redis_url: str | None = None

    api_host: str = "127.0.0.1"
    api_port: int = Field(8040, ge=0, le=65535)
    smtp_host: str = "127.0.0.1"
    smtp_port: int = Field(2525, ge=0, le=65535)
    # Empty means: accept mail for any domain.
    smtp_domains: str = ""
    smtp_max_bytes: int = Field(25 * 1024 * 1024, ge=1024)
    # Hostile senders: RCPTs past this get 452, connections past that get 421.
    smtp_max_recipients: int = Field(100, ge=1)
    smtp_max_connections: int = Field(64, ge=1)
    # A client that sends no command for this long gets 421 and is closed;
    # before its first command, for min(10, this). Bytes of a message still
    # arriving in DATA are not idleness.
    smtp_idle_seconds: float = Field(60.0, gt=0)
    # Sessions open at once from one client address; the next gets 421.
    smtp_max_connections_per_ip: int = Field(16, ge=1)
    # STARTTLS on the plain port: offered (on), required before MAIL, or off.
    smtp_tls: Literal["on", "required", "off"] = "on"
    # PEM files; without them a self-signed pair is made once in the data dir.
    smtp_tls_cert: str = ""
    smtp_tls_key: str = ""
    # The name in the banner, EHLO and the self-signed certificate (empty: the FQDN).
    smtp_hostname: str = ""
    # Implicit TLS (SMTPS) beside the plain port, same certificate; 0: off.
    smtps_port: int = Field(2465, ge=0, le=65535)
    # AUTH PLAIN/LOGIN: any credentials (optional), a namespace's token only
    # (required), or not offered (off).
    smtp_auth: Literal["optional", "required", "off"] = "optional"
    # Sink processes sharing the SMTP and SMTPS ports (SO_REUSEPORT), each with
    # its own event loop, parse pool and group commit; the connection limits
    # above hold per process. Default: the cores this process may run on.
    smtp_processes: int = Field(default_factory=lambda: usable_cores(), ge=1, le=256)
    api_tokens: str = ""
    # Operators: `name:token,…`; they triage every namespace, never read content.
    ops_tokens: str = ""
    flower_host: str = "127.0.0.1"
    flower_port: int = Field(5555, ge=0, le=65535)
    flower_basic_auth: str = ""
    data_dir: Path = Path(".signalbox")
    retention_hours: float = Field(72.0, gt=0)
    evidence_retention_hours: float = Field(24.0 * 90, gt=0)
    providers_file: Path = Path("config/providers.toml")
    idempotency_ttl_hours: float = Field(24.0, gt=0)

    # Embedded Redis listens on this loopback port so other processes can reach it.
    embedded_redis_port: int = Field(6390, ge=1, le=65535)

    # Worker behaviour.
    check_lease_seconds: float = Field(30.0, gt=0)
    backoff_base_seconds: float = Field(1.0, gt=0)
    backoff_cap_seconds: float = Field(30.0, gt=0)
    # Signals of one provider due within this window share one provider call.
    coalesce_window_seconds: float = Field(2.0, ge=0)
    sweep_interval_seconds: float = Field(1.0, gt=0)
    # A task sent this long ago that left its signal due, while no task waits
    # in the queue, was lost (broker restart, worker killed) and is re-sent.
    requeue_after_seconds: float = Field(20.0, gt=0)
    # How long after its deadline a signal waits for its final look before
    # the sweep expires it anyway (no worker took the final check).
    deadline_grace_seconds: float = Field(60.0, gt=0)
    # How often providers are looked at for mail that arrives after its
    # signal expired (within a day of the deadline): the dead letter's late_message.
    late_watch_interval_seconds: float = Field(60.0, gt=0)
    # Celery time limits of a check task (soft: the provider call is given up
    # as a `timeout` provider error; hard: the process is replaced).
    check_soft_time_limit_seconds: float = Field(120.0, gt=0)
    check_time_limit_seconds: float = Field(180.0, gt=0)
    # Every database session: no statement or lock wait runs unbounded.
    db_statement_timeout_ms: int = Field(30000, ge=0)
    db_lock_timeout_ms: int = Field(10000, ge=0)
    max_consecutive_provider_errors: int = Field(10, ge=1)
    breaker_failure_threshold: int = Field(5, ge=1)
    breaker_open_seconds: float = Field(30.0, gt=0)
    max_claims: int = Field(3, ge=1)
    mailbox_ttl_hours: float = Field(24.0, gt=0)
    mailbox_domain: str = "signalbox.test"
    log_level: str = "INFO"
    # `auto`: readable lines when the log stream (stderr) is a terminal, else JSON.
    log_format: Literal["auto", "json", "text"] = "auto"

    # Running on many machines (deploy/kubernetes, docker-compose).
    # Each long-running process serves its own Prometheus metrics on this
    # port when set (none: only the API's /metrics).
    metrics_port: int | None = Field(None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    # Whether this process also serves the gauges read from PostgreSQL and
    # Redis (signals, oldest due, dead letters, circuits). Unset: only the API.
    # In a multi-pod deployment set it true on exactly one kind of process.
    metrics_db_gauges: bool | None = None
    # uvicorn worker processes of the API (0: 1 for `api`, the cores for `up`).
    api_workers: int = Field(0, ge=0, le=64)
    # Set by `up` for its API: the other parts /readyz must also see alive
    # (comma-separated among smtp, worker, beat).
    ready_parts: str = ""
    # Tenants and hostile input.
    api_max_body_bytes: int = Field(1024 * 1024, ge=1024)
    max_lookback_hours: float = Field(24.0, gt=0)
    # How far ahead of the server's clock `received_after` may be.
    max_lookahead_hours: float = Field(1.0, ge=0)
    max_long_polls: int = Field(1000, ge=1)
    max_waiting_per_namespace: int = Field(10_000, ge=1)
    # `namespace:domain,…`: mail to an owned domain is that namespace's only.
    namespace_domains: str = ""
    # An address nobody owns is held by the first namespace that watches it,
    # until this long after that namespace's last signal on it ended.
    address_hold_hours: float = Field(24.0, ge=0)
    # `addr@x,@domain,…`: addresses every namespace may watch at once (no privacy).
    shared_addresses: str = ""
    # Proxies (addresses or CIDR networks, comma-separated) whose
    # X-Forwarded-For the API believes: the client address the auth-failure
    # throttle counts by. Anyone else's X-Forwarded-For is ignored.
    trusted_proxies: str = "127.0.0.1,::1"
    # Live mailboxes a namespace may have at once; the next create gets 429.
    max_mailboxes_per_namespace: int = Field(1000, ge=1)
    # The text `body_contains` searches: the first this many bytes of a
    # message's normalised text.
    match_text_max_bytes: int = Field(1024 * 1024, ge=1024)
    # Raw mail one look holds at a time, however many messages its window
    # has: it reads a few messages' bytes, parses them, drops them.
    look_max_bytes: int = Field(64 * 1024 * 1024, ge=1024 * 1024)
    # Chaos on the sink: a rule ends this long after it was set, at the latest.
    chaos_max_seconds: int = Field(3600, ge=1, le=7 * 86400)
    # Triage: the dead-letter webhook (empty URL: off) and the SRE console.
    dead_letter_webhook_url: str = ""
    # HMAC-SHA256 key of the `X-Signalbox-Signature` header (empty: unsigned).
    dead_letter_webhook_secret: str = ""
    webhook_timeout_seconds: float = Field(10.0, gt=0, le=120)
    # Retries go on with exponential backoff for this long, then the delivery fails.
    webhook_retry_hours: float = Field(24.0, gt=0)
    webhook_backoff_base_seconds: float = Field(5.0, gt=0)
    webhook_backoff_cap_seconds: float = Field(900.0, gt=0)
    # How often beat looks for deliveries that are due.
    webhook_poll_seconds: float = Field(5.0, gt=0)
    # Signs console sessions; if empty, a random one is kept in data_dir
    # (one replica only: several API replicas must share this setting).
    console_secret: str = ""
    console_session_hours: float = Field(12.0, gt=0, le=24 * 30)
    # The console's cookies are `Secure` (and its answers carry HSTS). Unset:
    # unless the API binds a loopback address (behind a TLS ingress the API
    # sees plain HTTP, so the scheme cannot decide).
    console_secure_cookies: bool | None = None
    # Keys the recipient hash of evidence and logs; if empty, a random one is
    # kept in data_dir (one host only: every process of a deployment must share it).
    recipient_hash_key: str = ""

    @field_validator("api_tokens", "ops_tokens")
    @classmethod
    def _tokens_are_pairs(cls, value: str) -> str:
        for pair in _items(value):
            owner, sep, token = pair.partition(":")
            if not sep or not owner or not token:
                raise ValueError("expected name:token pairs separated by commas")
        return value

    @field_validator("recipient_hash_key")
    @classmethod
    def _hash_key_is_long(cls, value: str) -> str:
        if value and len(value) < 16:
            raise ValueError("at least 16 characters (a short key is guessed)")
        return value

    @field_validator("namespace_domains")
    @classmethod
    def _domains_have_one_owner(cls, value: str) -> str:
        _domain_owners(value)
        return value

    @field_validator("shared_addresses")
    @classmethod
    def _shared_are_addresses(cls, value: str) -> str:
        _shared_entries(value)
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_networks(cls, value: str) -> str:
        for item in _items(value):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or CIDR network") from None
        return value

    @field_validator("flower_basic_auth")
    @classmethod
    def _basic_auth_pairs(cls, value: str) -> str:
        for pair in _items(value):
            if ":" not in pair:
                raise ValueError("expected user:password pairs separated by commas")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = Path(os.environ.get(CONFIG_FILE_ENV, str(DEFAULT_CONFIG_FILE)))
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file))

    @property
    def token_map(self) -> dict[str, str]:
        """token -> namespace, from SIGNALBOX_API_TOKENS."""
        return _pairs(self.api_tokens)

    @property
    def ops_token_map(self) -> dict[str, str]:
        """token -> operator name, from SIGNALBOX_OPS_TOKENS."""
        return _pairs(self.ops_tokens)

    @property
    def namespace_domain_owners(self) -> dict[str, str]:
        """domain -> the namespace that owns it, from SIGNALBOX_NAMESPACE_DOMAINS."""
        return _domain_owners(self.namespace_domains)

    @property
    def shared_address_entries(self) -> frozenset[str]:
        """SIGNALBOX_SHARED_ADDRESSES, lower-cased: `addr@x` or `@domain` entries."""
        return _shared_entries(self.shared_addresses)

    @property
    def console_cookies_secure(self) -> bool:
        """SIGNALBOX_CONSOLE_SECURE_COOKIES, else whether the API binds a
        non-loopback address."""
        if self.console_secure_cookies is not None:
            return self.console_secure_cookies
        return not _is_loopback(self.api_host)

    @property
    def accepted_domains(self) -> frozenset[str]:
        return frozenset(d.strip().lower() for d in self.smtp_domains.split(",") if d.strip())

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL with the psycopg 3 driver named."""
        if not self.database_url:
            raise ConfigurationError(
                "SIGNALBOX_DATABASE_URL is not set and nothing embedded started"
            )
        return to_sqlalchemy_url(self.database_url)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a name: reachable from elsewhere, as far as we know


def _items(value: str) -> list[str]:
    """The items of a comma-separated setting, stripped, blanks dropped."""
    return [p for p in (p.strip() for p in value.split(",")) if p]


def _pairs(value: str) -> dict[str, str]:
    """`owner:token,…` → {token: owner}."""
    out: dict[str, str] = {}
    for pair in _items(value):
        owner, _, token = pair.partition(":")
        out[token] = owner
    return out


def _shared_entries(value: str) -> frozenset[str]:
    """`addr@x,@domain,…` → the lower-cased entries; anything else fails."""
    out: set[str] = set()
    for item in _items(value):
        entry = item.strip().lower()
        local, at, domain = entry.rpartition("@")
        if not at or not domain or "@" in local or any(c.isspace() for c in entry):
            raise ValueError(f"{item!r} is neither an address (addr@domain) nor a domain (@domain)")
        out.add(entry)
    return frozenset(out)


def _domain_owners(value: str) -> dict[str, str]:
    """`namespace:domain,…` → {domain: namespace}; a domain given twice fails."""
    out: dict[str, str] = {}
    for pair in _items(value):
        namespace, sep, domain = (part.strip() for part in pair.partition(":"))
        domain = domain.lower().lstrip("@")
        if not sep or not namespace or not domain or "@" in domain or ":" in domain:
            raise ValueError("expected namespace:domain pairs separated by commas")
        if out.get(domain, namespace) != namespace:
            raise ValueError(f"domain {domain} is given to {out[domain]} and {namespace}")
        out[domain] = namespace
    return out


def to_sqlalchemy_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def load_settings(**overrides: Any) -> Settings:
    """Read and validate settings; raise ConfigurationError naming the variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"SIGNALBOX_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigurationError(f"invalid settings: {problems}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
