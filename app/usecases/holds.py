"""Holds: an address nobody owns is held by the first namespace that uses it
(a signal on it, or a chaos rule for it), for as long as
`app.domain.ownership` says. A create takes a free address's hold in its
own statement; another namespace's hold is judged here, locked, by
`app.domain.admission.hold_lapse`."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection

from app.db import holds as holds_db
from app.db import server as server_db
from app.db.engine import transaction
from app.domain import ownership
from app.domain.admission import hold_lapse
from app.errors import RecipientNotOwned
from app.settings import Settings
from app.usecases.visibility import may_use_address, owners_of


def _held_elsewhere() -> RecipientNotOwned:
    # Says no more than that: who holds it is not this caller's business.
    return RecipientNotOwned(
        "the address is in use by another namespace; watch an address of your own"
        " (POST /v1/mailboxes, or a unique one) or ask for it in SIGNALBOX_SHARED_ADDRESSES",
        field="recipient",
    )


def _release_if_lapsed(
    settings: Settings, session: Connection, namespace: str, address: str, now: datetime
) -> bool:
    """With the address's open hold locked (a create of its holder, which
    locks it FOR SHARE, is waited for): False when another namespace holds
    it and its hold stands; else True, the hold released at the moment it
    lapsed (so the mail it covered stays its namespace's for good) when it
    was another namespace's."""
    held = holds_db.hold_open_get(session, address, for_update=True)
    if held is None or held["namespace"] == namespace:
        return True
    facts = holds_db.hold_signals_facts(session, address, held["namespace"])
    lapses = hold_lapse(
        held["held_from"],
        facts["live"],
        facts["last_end"],
        timedelta(hours=settings.address_hold_hours),
        now,
    )
    if lapses is None:
        return False
    holds_db.hold_release(session, held["id"], lapses)
    return True


def release_lapsed(settings: Settings, namespace: str, address: str) -> None:
    """A create found `address` held by another namespace: release that hold
    if it lapsed (the create's statement then runs again and takes it), or
    refuse. Another namespace holds it while one of its signals on it is
    live, and for SIGNALBOX_ADDRESS_HOLD_HOURS after the last one ended."""
    address = address.strip().lower()
    with transaction() as session:
        if not _release_if_lapsed(settings, session, namespace, address, server_db.db_now(session)):
            raise _held_elsewhere()


def take_hold(
    settings: Settings, session: Connection, namespace: str, address: str, now: datetime
) -> None:
    """Make `namespace` the holder of `address` (nobody owns it), or refuse
    (`release_lapsed`). Takers of one address run one at a time (an advisory
    lock)."""
    holds_db.hold_lock(session, address)
    if not _release_if_lapsed(settings, session, namespace, address, now):
        raise _held_elsewhere()
    if holds_db.hold_open_get(session, address) is None:
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
