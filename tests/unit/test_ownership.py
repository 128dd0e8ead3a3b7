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


# -- holds and who a message belongs to -------------------------------------------

from datetime import UTC, datetime, timedelta  # noqa: E402

from app.domain.ownership import (  # noqa: E402
    PUBLIC,
    Hold,
    SmtpAuth,
    belongs_to,
    hold_lapses_at,
    is_shared,
    sees,
    smtp_auth_outcome,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _belongs(recipients, at, *, owners=None, shared=(), holds=None):  # type: ignore[no-untyped-def]
    owners = owners or {}
    return belongs_to(
        recipients,
        at,
        owner=lambda a: owners.get(a),
        shared=lambda a: is_shared(a, frozenset(shared)),
        holds=holds or {},
    )


def test_an_owned_recipient_gives_the_message_to_its_owners_alone() -> None:
    holds = {"audit@x.test": [Hold("b", T0 - timedelta(hours=1))]}
    got = _belongs(
        ["secret@a.test", "audit@x.test"], T0, owners={"secret@a.test": "a"}, holds=holds
    )
    assert got == {"a"}
    assert not sees("b", got)


def test_a_held_recipient_gives_the_message_to_who_held_it_when_it_arrived() -> None:
    holds = {
        "u@x.test": [
            Hold("a", T0, released_at=T0 + timedelta(hours=25)),
            Hold("b", T0 + timedelta(hours=26)),
        ]
    }
    assert _belongs(["u@x.test"], T0 + timedelta(hours=1), holds=holds) == {"a"}
    # Between A's lapse and B's take-over: nobody's, so the next holder's.
    assert _belongs(["u@x.test"], T0 + timedelta(hours=25, minutes=30), holds=holds) == {"b"}
    assert _belongs(["u@x.test"], T0 + timedelta(hours=27), holds=holds) == {"b"}
    # Before any hold: the first holder's.
    assert _belongs(["u@x.test"], T0 - timedelta(days=1), holds=holds) == {"a"}


def test_a_message_nobody_holds_is_nobody_s_and_one_to_shared_addresses_public() -> None:
    assert _belongs(["u@x.test"], T0) == frozenset()
    got = _belongs(["qa@shared.test"], T0, shared={"@shared.test"})
    assert got == PUBLIC and sees("anyone", got)
    # A held recipient beside a shared one: the holder's only.
    holds = {"u@x.test": [Hold("a", T0 - timedelta(minutes=1))]}
    assert _belongs(["u@x.test", "qa@shared.test"], T0, shared={"@shared.test"}, holds=holds) == {
        "a"
    }


def test_two_holders_of_two_recipients_both_see_it() -> None:
    holds = {"u@x.test": [Hold("a", T0)], "v@x.test": [Hold("b", T0)]}
    assert _belongs(["u@x.test", "v@x.test"], T0 + timedelta(seconds=1), holds=holds) == {"a", "b"}


def test_a_hold_lapses_its_hours_after_the_last_signal_ended() -> None:
    hold = timedelta(hours=24)
    assert hold_lapses_at(T0, None, hold) == T0 + hold
    assert hold_lapses_at(T0, T0 + timedelta(hours=2), hold) == T0 + timedelta(hours=26)
    assert hold_lapses_at(T0, T0 - timedelta(hours=2), hold) == T0 + hold


def test_shared_entries_match_an_address_or_a_whole_domain() -> None:
    entries = frozenset({"qa@x.test", "@shared.test"})
    assert is_shared("QA@x.test", entries)
    assert is_shared("any@shared.test", entries)
    assert not is_shared("other@x.test", entries)
    assert not is_shared("any@sub.shared.test", entries)


def test_only_delivered_to_addresses_decide_never_a_header_the_sender_wrote() -> None:
    """Mail delivered to a list nobody holds is nobody's now, whatever its Cc
    names (the envelope decides where the provider knows it, §11.1); it goes
    to whoever holds the list afterwards."""
    holds = {
        "me@x.test": [Hold("a", T0 - timedelta(minutes=1))],
        "list@x.test": [Hold("b", T0 + timedelta(minutes=5))],
    }
    got = belongs_to(["list@x.test"], T0, owner=lambda a: None, shared=lambda a: False, holds=holds)
    assert got == {"b"}
    assert not sees("a", got)


def test_mail_authenticated_with_a_namespace_token_is_that_namespace_s_alone() -> None:
    """team-b's token on mail to an address team-a owns or holds: team-b's only."""
    holds = {"held@x.test": [Hold("team-a", T0 - timedelta(minutes=1))]}
    for recipients, owners in (
        (["held@x.test"], {}),
        (["mine@a.test"], {"mine@a.test": "team-a"}),
        (["qa@shared.test"], {}),
    ):
        got = belongs_to(
            recipients,
            T0,
            owner=lambda a, o=owners: o.get(a),  # type: ignore[misc]
            shared=lambda a: a.endswith("@shared.test"),
            holds=holds,
            authenticated="team-b",
        )
        assert got == {"team-b"}
        assert not sees("team-a", got)
    assert _belongs(["held@x.test"], T0, holds=holds) == {"team-a"}  # without AUTH


def test_the_smtp_auth_token_rule() -> None:
    assert smtp_auth_outcome("optional", None) == SmtpAuth(True, None)
    assert smtp_auth_outcome("optional", "team-b") == SmtpAuth(True, "team-b")
    assert smtp_auth_outcome("required", "team-b") == SmtpAuth(True, "team-b")
    assert smtp_auth_outcome("required", None) == SmtpAuth(False)
    assert smtp_auth_outcome("off", "team-b") == SmtpAuth(False)
