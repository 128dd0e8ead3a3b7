"""Who owns an address: a mailbox's creator, else its domain's namespace, else nobody."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.ownership import domain_of, may_use, owner_of
from app.errors import ConfigurationError
from app.settings import load_settings

DOMAINS = {"team-a.test": "a", "mail.team-a.test": "a", "team-b.test": "b"}


def test_mailbox_owner_wins_over_the_domain_owner() -> None:
    assert owner_of("sbx-1@team-b.test", DOMAINS, mailbox_owner="a") == "a"


def test_address_on_an_owned_domain_belongs_to_that_namespace() -> None:
    assert owner_of("qa@team-a.test", DOMAINS, None) == "a"
    assert owner_of("qa@mail.team-a.test", DOMAINS, None) == "a"
    assert owner_of("QA@Team-B.Test", DOMAINS, None) == "b"


def test_address_on_any_other_domain_is_shared() -> None:
    assert owner_of("qa@example.test", DOMAINS, None) is None
    # A subdomain of an owned domain is not owned unless listed.
    assert owner_of("qa@sub.team-b.test", DOMAINS, None) is None
    assert owner_of("not-an-address", DOMAINS, None) is None


def test_a_namespace_may_use_what_it_owns_and_what_is_shared_only() -> None:
    assert may_use("a", "a")
    assert may_use("a", None)
    assert not may_use("a", "b")


@given(st.emails(), st.sampled_from([None, "a", "b"]))
def test_owner_is_the_mailbox_owner_or_the_domain_owner(address: str, mailbox: str | None) -> None:
    got = owner_of(address, DOMAINS, mailbox)
    assert got == (mailbox if mailbox is not None else DOMAINS.get(domain_of(address)))


def test_settings_map_each_domain_to_its_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "SIGNALBOX_NAMESPACE_DOMAINS", "a:Team-A.test, a:mail.team-a.test,b:team-b.test"
    )
    assert load_settings().namespace_domain_owners == DOMAINS


def test_a_domain_given_to_two_namespaces_fails_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIGNALBOX_NAMESPACE_DOMAINS", "a:shared.test,b:SHARED.test")
    with pytest.raises(ConfigurationError, match="SIGNALBOX_NAMESPACE_DOMAINS"):
        load_settings()


@pytest.mark.parametrize("value", ["a", "a:", ":x.test", "a:b@x.test"])
def test_malformed_namespace_domains_fail_fast(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SIGNALBOX_NAMESPACE_DOMAINS", value)
    with pytest.raises(ConfigurationError, match="SIGNALBOX_NAMESPACE_DOMAINS"):
        load_settings()
