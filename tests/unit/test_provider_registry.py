"""The providers file loader and the provider factory (no I/O but a temporary file)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.errors import ConfigurationError
from app.providers.imap import ImapProvider
from app.providers.maildev import MaildevProvider
from app.providers.registry import ProviderConfig, build_provider, load_providers

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str], Path]:
    def write(text: str) -> Path:
        path = tmp_path / "providers.toml"
        path.write_text(text)
        return path

    return write


IMAP = """
[providers.corp-imap]
type = "imap"
host = "imap.example.com"
port = 993
tls = true
username = "qa@example.com"
password_env = "CORP_IMAP_PASSWORD"
folder = "INBOX"
"""

MAILDEV = """
[providers.catcher]
type = "maildev"
url = "http://127.0.0.1:1080"
"""


def test_without_a_file_only_the_sink_exists() -> None:
    assert load_providers(None, {}) == {"sink": ProviderConfig("sink", "sink")}


def test_the_sink_exists_even_when_the_file_does_not_name_it(
    write: Callable[[str], Path],
) -> None:
    providers = load_providers(write(MAILDEV), {})

    assert set(providers) == {"sink", "catcher"}
    assert providers["sink"].type == "sink"


def test_the_contract_example_loads_with_defaults_and_without_the_secret(
    write: Callable[[str], Path],
) -> None:
    providers = load_providers(write(IMAP + MAILDEV), {"CORP_IMAP_PASSWORD": "hunter2"})

    imap = providers["corp-imap"]
    assert imap.type == "imap"
    assert dict(imap.options) == {
        "host": "imap.example.com",
        "port": 993,
        "tls": True,
        "username": "qa@example.com",
        "password_env": "CORP_IMAP_PASSWORD",
        "folder": "INBOX",
        "timeout": 10.0,
    }
    assert "hunter2" not in repr(providers)
    assert dict(providers["catcher"].options) == {"url": "http://127.0.0.1:1080", "timeout": 5.0}


def test_config_options_cannot_be_changed_after_loading(write: Callable[[str], Path]) -> None:
    config = load_providers(write(MAILDEV), {})["catcher"]

    with pytest.raises(TypeError):
        config.options["url"] = "http://elsewhere"  # type: ignore[index]


def test_a_literal_password_is_refused_naming_the_provider(
    write: Callable[[str], Path],
) -> None:
    text = IMAP.replace('password_env = "CORP_IMAP_PASSWORD"', 'password = "hunter2"')

    with pytest.raises(ConfigurationError) as raised:
        load_providers(write(text), {})

    message = str(raised.value)
    assert "corp-imap" in message
    assert "password" in message
    assert "hunter2" not in message


def test_a_literal_password_is_refused_even_next_to_password_env(
    write: Callable[[str], Path],
) -> None:
    with pytest.raises(ConfigurationError, match="catcher"):
        load_providers(write(MAILDEV + 'password = "x"\n'), {})


def test_a_missing_password_variable_is_an_error_naming_the_variable(
    write: Callable[[str], Path],
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_providers(write(IMAP), {"OTHER": "x"})

    assert "CORP_IMAP_PASSWORD" in str(raised.value)
    assert raised.value.details.get("variable") == "CORP_IMAP_PASSWORD"


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"

    with pytest.raises(ConfigurationError, match=r"nope\.toml"):
        load_providers(missing, {})


def test_invalid_toml_is_an_error_naming_the_file(write: Callable[[str], Path]) -> None:
    with pytest.raises(ConfigurationError, match=r"providers\.toml.*not valid TOML"):
        load_providers(write("[providers.x\ntype="), {})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('[providers.x]\nhost = "h"\n', "'type' is required"),
        ('[providers.x]\ntype = "pop3"\n', "unknown type 'pop3'"),
        ('[providers.sink]\ntype = "maildev"\nurl = "http://h"\n', "reserved"),
        ('[providers."bad name"]\ntype = "sink"\n', "name must be"),
        ('[providers.c]\ntype = "maildev"\n', "'url' is required"),
        ('[providers.c]\ntype = "maildev"\nurl = "ftp://h"\n', "http:// or https://"),
        ('[providers.c]\ntype = "maildev"\nurl = "http://u:p@h"\n', "credentials"),
        ('[providers.c]\ntype = "maildev"\nurl = "http://h"\nurll = 1\n', "unknown option"),
        ('[providers.c]\ntype = "maildev"\nurl = "http://h"\ntimeout = 0\n', "positive"),
        ('[providers.c]\ntype = "maildev"\nurl = "http://h"\nusername = "u"\n', "go together"),
        (IMAP.replace("port = 993", "port = true"), "'port' has the wrong type"),
        (IMAP.replace("port = 993", "port = 70000"), "port number"),
        (IMAP.replace('host = "imap.example.com"', ""), "'host' is required"),
        ('top = 1\n[providers.c]\ntype = "sink"\n', "unknown top-level key"),
    ],
)
def test_invalid_provider_tables_are_refused_with_the_reason(
    write: Callable[[str], Path], text: str, fragment: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_providers(write(text), {"CORP_IMAP_PASSWORD": "x"})

    assert fragment in str(raised.value)


def test_imap_port_defaults_by_tls_when_built(write: Callable[[str], Path]) -> None:
    text = IMAP.replace("port = 993\n", "").replace("tls = true", "tls = false")
    environ = {"CORP_IMAP_PASSWORD": "hunter2"}
    config = load_providers(write(text), environ)["corp-imap"]

    provider = build_provider(config, environ)

    assert isinstance(provider, ImapProvider)
    assert (provider.port, provider.tls, provider.username) == (143, False, "qa@example.com")
    assert provider.type == "imap" and provider.name == "corp-imap"
    assert "hunter2" not in repr(provider)


def test_build_reads_the_password_from_the_environment_at_build_time() -> None:
    config = ProviderConfig(
        "m",
        "maildev",
        {"url": "http://h:1080", "username": "u", "password_env": "MAILDEV_PW", "timeout": 2.0},
    )

    provider = build_provider(config, {"MAILDEV_PW": "pw"})
    assert isinstance(provider, MaildevProvider)
    assert (provider.url, provider.timeout, provider.username) == ("http://h:1080", 2.0, "u")

    with pytest.raises(ConfigurationError, match="MAILDEV_PW"):
        build_provider(config, {})


def test_build_of_an_unknown_type_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="'carrier-pigeon'"):
        build_provider(ProviderConfig("p", "carrier-pigeon"), {})


def test_build_of_the_sink_calls_the_sink_factory_with_name_and_options(
    write: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Mapping[str, Any]] = []

    class FakeSink:
        type = "sink"

        def __init__(self, **kwargs: Any) -> None:
            calls.append(kwargs)
            self.name = kwargs["name"]

    module = types.ModuleType("app.providers.sink")
    module.SinkProvider = FakeSink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "app.providers.sink", module)
    text = '[providers.sink]\ntype = "sink"\nsimulate_latency_seconds = 0.5\n'
    config = load_providers(write(text), {})["sink"]

    provider = build_provider(config, {})

    assert isinstance(provider, FakeSink)
    assert calls == [{"name": "sink", "simulate_latency_seconds": 0.5}]


def test_the_example_providers_file_in_the_repository_loads() -> None:
    providers = load_providers(REPO_ROOT / "config" / "providers.toml", {})

    assert providers["sink"].type == "sink"
