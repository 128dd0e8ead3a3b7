"""Which namespaces may see a message: the one question every path that
shows mail (matches, near misses, late mail, the console, the whole-message
routes) asks before it shows one."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.db import messages as messages_db
from app.settings import Settings
from app.usecases.checks.criteria import recipient_owners


def visible_ids(
    session: Session, settings: Settings, namespace: str, message_ids: Sequence[str]
) -> set[str]:
    """The ids among `message_ids` that `namespace` may see."""
    rows = messages_db.message_get_many(session, list(message_ids))
    recipients = {r.lower() for row in rows.values() for r in row["recipients"]}
    owners = recipient_owners(session, settings, recipients)
    return {
        mid
        for mid, row in rows.items()
        if any(owners.get(r.lower()) in (None, namespace) for r in row["recipients"])
    }


def may_see(session: Session, settings: Settings, namespace: str, message_id: str) -> bool:
    """Whether `namespace` may see the message `message_id` (False when unknown)."""
    return message_id in visible_ids(session, settings, namespace, [message_id])


def may_use_address(session: Session, settings: Settings, namespace: str, address: str) -> bool:
    """Whether `namespace` owns or holds `address` (or may hold it: nobody else does),
    i.e. may watch it or set rules on it."""
    owner = recipient_owners(session, settings, {address.lower()}).get(address.lower())
    return owner in (None, namespace)
