"""Which namespaces may see a message: the one question every path that
shows mail (matches, near misses, late mail, `messages_seen`, the console,
the whole-message routes) asks before it shows one.

A message belongs to the namespaces that owned or held one of the
recipients it was delivered to (`delivered_to`: its envelope where the
provider knows it, else To and Cc) when it was received, or to the
namespace whose API token its SMTP sender authenticated with alone
(`app.domain.ownership.belongs_to`); only those see it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import Connection

from app.db import holds as holds_db
from app.db import mailboxes as mailboxes_db
from app.db import messages as messages_db
from app.domain.ownership import belongs_to, is_shared, owner_of, sees
from app.settings import Settings

# A message as ownership sees it: (our id, when it was received, the
# recipients it was delivered to, the namespace its sender authenticated
# for over SMTP or None).
Delivery = tuple[str, datetime, Sequence[str], str | None]


def belonging(
    session: Connection, settings: Settings, deliveries: Iterable[Delivery]
) -> dict[str, frozenset[str]]:
    """message id → the namespaces it belongs to (ownership.PUBLIC: all)."""
    deliveries = list(deliveries)
    addresses = sorted({a.strip().lower() for _, _, rcpts, _ in deliveries for a in rcpts})
    mailboxes, holds = holds_db.standing_many(session, addresses)
    domains = settings.namespace_domain_owners
    shared = settings.shared_address_entries

    def owner(address: str) -> str | None:
        return owner_of(address, domains, mailboxes.get(address))

    def listed(address: str) -> bool:
        return is_shared(address, shared)

    return {
        mid: belongs_to(
            rcpts, received_at, owner=owner, shared=listed, holds=holds, authenticated=auth
        )
        for mid, received_at, rcpts, auth in deliveries
    }


def visible_ids(
    session: Connection,
    settings: Settings,
    namespace: str,
    message_ids: Sequence[str],
    *,
    unclaimed: bool = False,
) -> set[str]:
    """The ids among `message_ids` that `namespace` may see; `unclaimed`
    adds those that belong to nobody yet (no namespace owned or held any of
    their recipients, then or since: what a recipient typo may point at)."""
    rows = messages_db.message_deliveries(session, list(message_ids))
    belongs = belonging(session, settings, rows)
    return {mid for mid, b in belongs.items() if sees(namespace, b) or (unclaimed and not b)}


def may_see(session: Connection, settings: Settings, namespace: str, message_id: str) -> bool:
    """Whether `namespace` may see the message `message_id` (False when unknown)."""
    return message_id in visible_ids(session, settings, namespace, [message_id])


def _standing(
    session: Connection, settings: Settings, address: str
) -> tuple[str | None, bool, str | None]:
    """(its owner, whether it is shared, the namespace of its open hold) of `address`."""
    address = address.strip().lower()
    owner = owner_of(
        address,
        settings.namespace_domain_owners,
        mailboxes_db.mailbox_owner_many(session, [address]).get(address),
    )
    if owner is not None:
        return owner, False, None
    if is_shared(address, settings.shared_address_entries):
        return None, True, None
    held = holds_db.hold_open_get(session, address)
    return None, False, held["namespace"] if held is not None else None


def may_use_address(session: Connection, settings: Settings, namespace: str, address: str) -> bool:
    """Whether `namespace` owns or holds `address`: what a rule on an address
    (chaos) needs. A shared address is nobody's: no namespace sets rules on it."""
    owner, shared, holder = _standing(session, settings, address)
    if owner is not None:
        return owner == namespace
    return not shared and holder == namespace


def may_watch(session: Connection, settings: Settings, namespace: str, address: str) -> bool:
    """Whether `namespace` owns, holds or shares `address`, or nobody owns or
    holds it (a signal of `namespace` on it would be allowed, holds aside
    that have lapsed)."""
    owner, shared, holder = _standing(session, settings, address)
    if owner is not None:
        return owner == namespace
    return shared or holder in (None, namespace)


def owners_of(
    session: Connection, settings: Settings, addresses: Iterable[str]
) -> Mapping[str, str | None]:
    """address → the namespace owning it (a mailbox or an owned domain; None: nobody)."""
    addresses = sorted({a.strip().lower() for a in addresses})
    mailboxes = mailboxes_db.mailbox_owner_many(session, addresses)
    domains = settings.namespace_domain_owners
    return {a: owner_of(a, domains, mailboxes.get(a)) for a in addresses}
