"""Settings are validated at start-up and a wrong one names its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import ConfigurationError
from app.settings import load_settings, to_sqlalchemy_url


def test_wrong_setting_fails_fast_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALBOX_SMTP_PORT", "not-a-port")
    with pytest.raises(ConfigurationError) as err:
        load_settings()
    assert "SIGNALBOX_SMTP_PORT" in err.value.message


def test_tokens_must_be_namespace_token_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALBOX_API_TOKENS", "team-a:tok1,broken")
    with pytest.raises(ConfigurationError) as err:
        load_settings()
    assert "SIGNALBOX_API_TOKENS" in err.value.message


def test_trusted_proxies_must_be_addresses_or_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALBOX_TRUSTED_PROXIES", "10.0.0.0/8, ingress.local")
    with pytest.raises(ConfigurationError) as err:
        load_settings()
    assert "SIGNALBOX_TRUSTED_PROXIES" in err.value.message
    monkeypatch.setenv("SIGNALBOX_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.7, ::1")
    assert load_settings().trusted_proxies == "10.0.0.0/8, 192.0.2.7, ::1"


def test_token_map_reads_every_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALBOX_API_TOKENS", "team-a:tok1, team-b:tok2")
    assert load_settings().token_map == {"tok1": "team-a", "tok2": "team-b"}


def test_defaults_are_the_contracts(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SIGNALBOX_API_PORT", "SIGNALBOX_SMTP_PORT", "SIGNALBOX_SMTP_MAX_BYTES"):
        monkeypatch.delenv(var, raising=False)
    s = load_settings()
    assert (s.api_host, s.api_port, s.smtp_port) == ("127.0.0.1", 8040, 2525)
    assert s.smtp_max_bytes == 25 * 1024 * 1024 and s.flower_port == 5555
    assert s.idempotency_ttl_hours == 24


def test_database_urls_get_the_psycopg_driver() -> None:
    assert to_sqlalchemy_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert (
        to_sqlalchemy_url("postgresql://u@/db?host=/tmp") == "postgresql+psycopg://u@/db?host=/tmp"
    )


def test_settings_come_from_the_toml_file_and_env_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "signalbox.toml"
    config.write_text('api_port = 9001\nsmtp_domains = "qa.example.test"\n')
    monkeypatch.setenv("SIGNALBOX_CONFIG_FILE", str(config))
    monkeypatch.delenv("SIGNALBOX_API_PORT", raising=False)
    monkeypatch.delenv("SIGNALBOX_SMTP_DOMAINS", raising=False)
    assert load_settings().api_port == 9001
    assert load_settings().accepted_domains == frozenset({"qa.example.test"})
    monkeypatch.setenv("SIGNALBOX_API_PORT", "9002")
    assert load_settings().api_port == 9002
