"""Who owns an address: the pure decision behind tenant privacy.

A mailbox's address belongs to the namespace that created it (for as long as
its row exists, deleted or not); otherwise an address on a domain listed in
`SIGNALBOX_NAMESPACE_DOMAINS` belongs to that domain's namespace; any other
address is shared (None): every namespace may wait on it.
"""

from __future__ import annotations

from collections.abc import Mapping


def domain_of(address: str) -> str:
    """The lower-cased domain of `address` (empty when it has none)."""
    _, at, domain = address.strip().rpartition("@")
    return domain.lower() if at else ""


def owner_of(
    address: str, domain_owners: Mapping[str, str], mailbox_owner: str | None
) -> str | None:
    """The namespace that owns `address`, or None when it is shared.

    `domain_owners` maps a lower-cased domain to its namespace;
    `mailbox_owner` is the namespace of the mailbox with this exact address,
    if any. The mailbox's owner wins over the domain's.
    """
    if mailbox_owner is not None:
        return mailbox_owner
    return domain_owners.get(domain_of(address))


def may_use(namespace: str, owner: str | None) -> bool:
    """A namespace may wait on (or make a mailbox at) an address it owns or a shared one."""
    return owner is None or owner == namespace
