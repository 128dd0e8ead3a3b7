"""Who owns a recipient address: pure, no I/O.

Mail to an owned address is visible to its owner namespace only; mail to an
address nobody owns is shared and matched per namespace (docs/api.md,
"Tenants").
"""

from __future__ import annotations

from collections.abc import Mapping


def owner_of(
    address: str, domain_owners: Mapping[str, str], mailbox_owner: str | None
) -> str | None:
    """The namespace owning `address`: its mailbox's creator first, then the
    owner of its domain; None when nobody owns it (shared)."""
    if mailbox_owner is not None:
        return mailbox_owner
    domain = address.rpartition("@")[2].strip().lower().rstrip(">")
    return domain_owners.get(domain)


def visible_to(namespace: str, owner: str | None) -> bool:
    """Whether mail to an address with `owner` may reach `namespace` at all."""
    return owner is None or owner == namespace
