"""Holds: an address nobody owns is held by the first namespace that uses it
(a signal on it, or a chaos rule for it), for as long as
`app.domain.ownership` says; taking one is decided here, in the caller's
transaction."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection

from app.db import holds as holds_db
from app.db import server as server_db
from app.domain import ownership
from app.errors import RecipientNotOwned
from app.settings import Settings
from app.usecases.visibility import may_use_address, owners_of


def take_hold(
    settings: Settings, session: Connection, namespace: str, address: str, now: datetime
) -> None:
    """Make `namespace` the holder of `address` (nobody owns it), or refuse:
    another namespace holds it while one of its signals on it is live, and
    for SIGNALBOX_ADDRESS_HOLD_HOURS after the last one ended. A lapsed hold
    is closed at the moment it lapsed, so the mail it covered stays its
    namespace's for good. Creates deciding one address run one at a time
    (an advisory lock; a create by the holder only shares the hold's row lock,
    never waits for this lock, so the two never wait for each other)."""
    holds_db.hold_lock(session, address)
    held = holds_db.hold_open_get(session, address, for_update=True)
    if held is None:
        holds_db.hold_insert(session, address, namespace, now)
        return
    if held["namespace"] == namespace:
        return
    facts = holds_db.hold_signals_facts(session, address, held["namespace"])
    lapses = ownership.hold_lapses_at(
        held["held_from"], facts["last_end"], timedelta(hours=settings.address_hold_hours)
    )
    if facts["live"] or now < lapses:
        # Says no more than that: who holds it is not this caller's business.
        raise RecipientNotOwned(
            "the address is in use by another namespace; watch an address of your own"
            " (POST /v1/mailboxes, or a unique one) or ask for it in SIGNALBOX_SHARED_ADDRESSES",
            field="recipient",
        )
    holds_db.hold_release(session, held["id"], lapses)
    holds_db.hold_insert(session, address, namespace, now)


def hold_for_rule(settings: Settings, session: Connection, namespace: str, address: str) -> bool:
    """Whether `namespace` may set a rule on `address`, taking the address's
    hold when nobody owns, shares or holds it (a chaos rule set before the
    test's signal is made): False when another namespace owns or holds it."""
    if may_use_address(session, settings, namespace, address):
        return True
    address = address.strip().lower()
    if owners_of(session, settings, [address])[address] is not None or ownership.is_shared(
        address, settings.shared_address_entries
    ):
        return False
    try:
        take_hold(settings, session, namespace, address, server_db.db_now(session))
    except RecipientNotOwned:
        return False
    return True
