"""Principals: tenants see their namespace, operators every namespace they ask for."""

from __future__ import annotations

import pytest

from app.settings import load_settings
from app.usecases.auth import Principal, principal_for_token


def test_tenant_scope_is_always_its_own_namespace() -> None:
    tenant = Principal(namespace="team-a")
    assert not tenant.is_ops
    assert tenant.scope() == "team-a"
    assert tenant.scope("team-b") == "team-a"


def test_operator_scope_is_the_filter_asked_for_or_everything() -> None:
    sre = Principal(operator="sre")
    assert sre.is_ops
    assert sre.scope() is None
    assert sre.scope("team-b") == "team-b"


def test_ops_token_resolves_to_an_operator_before_any_database_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIGNALBOX_API_TOKENS", "team-a:tok-a")
    monkeypatch.setenv("SIGNALBOX_OPS_TOKENS", "sre:tok-ops")
    settings = load_settings()
    assert settings.ops_token_map == {"tok-ops": "sre"}
    assert principal_for_token(settings, "tok-ops") == Principal(operator="sre")
    assert principal_for_token(settings, " tok-a ") == Principal(namespace="team-a")
    assert principal_for_token(settings, "") is None


def test_malformed_ops_tokens_fail_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.errors import ConfigurationError

    monkeypatch.setenv("SIGNALBOX_OPS_TOKENS", "no-colon-here")
    with pytest.raises(ConfigurationError, match="SIGNALBOX_OPS_TOKENS"):
        load_settings()
