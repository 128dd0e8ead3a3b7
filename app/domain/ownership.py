"""Who owns, holds and may see an address and its mail: the pure decisions
behind tenant privacy.

- **Owned**: a mailbox's address belongs to the namespace that created it (for
  as long as its row exists, deleted or not); otherwise an address on a
  domain listed in `SIGNALBOX_NAMESPACE_DOMAINS` belongs to that domain's
  namespace.
- **Shared**: an address listed in `SIGNALBOX_SHARED_ADDRESSES` (or on a
  listed `@domain`) that nobody owns: every namespace may watch it at once,
  and its mail is public.
- **Held**: any other address is held by the first namespace that watches
  it, until `SIGNALBOX_ADDRESS_HOLD_HOURS` after that namespace's last signal
  on it ended; then the next namespace may take it. Each hold is kept as an
  episode (namespace, from, until), so that who held an address at any
  moment is known for good.

A message belongs to the namespaces that owned or held one of its
recipients when it was received (its envelope recipients where the provider
knows them, never a To or Cc the sender wrote beside them), to the owners
alone when one recipient is owned; one delivered only to addresses nobody
owned or held belongs to the first namespace that held one of its
recipients afterwards; one sent only to shared addresses is public.

**Authenticated**: a message whose SMTP sender authenticated with a
namespace's API token as the password belongs to that namespace alone, as
if it owned every recipient (`smtp_auth_outcome`, `belongs_to`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


def domain_of(address: str) -> str:
    """The lower-cased domain of `address` (empty when it has none)."""
    _, at, domain = address.strip().rpartition("@")
    return domain.lower() if at else ""


def owner_of(
    address: str, domain_owners: Mapping[str, str], mailbox_owner: str | None
) -> str | None:
    """The namespace that owns `address`, or None when nobody does.

    `domain_owners` maps a lower-cased domain to its namespace;
    `mailbox_owner` is the namespace of the mailbox with this exact address,
    if any. The mailbox's owner wins over the domain's.
    """
    if mailbox_owner is not None:
        return mailbox_owner
    return domain_owners.get(domain_of(address))


def may_use(namespace: str, owner: str | None) -> bool:
    """A namespace may wait on (or make a mailbox at) an address it owns or nobody owns."""
    return owner is None or owner == namespace


def is_shared(address: str, entries: Collection[str]) -> bool:
    """Whether `address` is listed in `entries` (`addr@x` or `@domain`, lower-cased)."""
    address = address.strip().lower()
    return address in entries or ("@" + domain_of(address)) in entries


@dataclass(frozen=True)
class Hold:
    """One episode of a namespace holding an address: from `held_from` until
    `released_at` (None: it is the address's current hold, however long ago
    its last signal ended, until another namespace takes the address)."""

    namespace: str
    held_from: datetime
    released_at: datetime | None = None

    def covers(self, moment: datetime) -> bool:
        return self.held_from <= moment and (self.released_at is None or moment < self.released_at)


def hold_lapses_at(held_from: datetime, last_end: datetime | None, hold: timedelta) -> datetime:
    """When a hold with no live signal lapses: `hold` after its namespace's
    last signal on the address ended (or after the hold began, if none did)."""
    ended = held_from if last_end is None else max(held_from, last_end)
    return ended + hold


# A message sent only to shared addresses: every namespace may see it.
PUBLIC: frozenset[str] = frozenset({"*"})


def belongs_to(
    recipients: Iterable[str],
    received_at: datetime,
    *,
    owner: Callable[[str], str | None],
    shared: Callable[[str], bool],
    holds: Mapping[str, Sequence[Hold]],
    authenticated: str | None = None,
) -> frozenset[str]:
    """The namespaces a message delivered to `recipients` at `received_at`
    belongs to: PUBLIC (every namespace), or a set of namespaces (empty: nobody
    yet).

    `owner(address)` is the namespace owning it (None: nobody), `shared`
    says whether it is listed as shared, `holds` gives each address's hold
    episodes. `authenticated`: the namespace whose API token the sender
    authenticated with over SMTP; the message is that namespace's alone,
    whoever owns or holds its recipients."""
    if authenticated:
        return frozenset({authenticated})
    addresses = sorted({r.strip().lower() for r in recipients})
    owners = {o for o in map(owner, addresses) if o is not None}
    if owners:
        return frozenset(owners)
    held = [a for a in addresses if not shared(a)]
    holders = {h.namespace for a in held for h in holds.get(a, ()) if h.covers(received_at)}
    if holders:
        return frozenset(holders)
    later = [h for a in held for h in holds.get(a, ()) if h.held_from > received_at]
    if later:
        first = min(later, key=lambda h: (h.held_from, h.namespace))
        return frozenset({first.namespace})
    if len(held) < len(addresses):
        return PUBLIC
    return frozenset()


@dataclass(frozen=True)
class SmtpAuth:
    """What an SMTP AUTH attempt comes to: whether it is `accepted`, and the
    namespace its mail then belongs to alone (None: decided by its recipients)."""

    accepted: bool
    namespace: str | None = None


def smtp_auth_outcome(mode: str, token_namespace: str | None) -> SmtpAuth:
    """The token rule of the sink's AUTH (`SIGNALBOX_SMTP_AUTH`), given the
    namespace whose API token the password is (None: it is no token).

    - `optional`: every attempt is accepted; a token makes the mail its
      namespace's alone, any other password leaves it to its recipients;
    - `required`: only a token is accepted;
    - anything else (`off`): nothing is accepted (AUTH is not offered)."""
    if mode == "optional":
        return SmtpAuth(True, token_namespace)
    if mode == "required" and token_namespace is not None:
        return SmtpAuth(True, token_namespace)
    return SmtpAuth(False)


def sees(namespace: str, belongs: frozenset[str]) -> bool:
    """Whether `namespace` may see a message that belongs to `belongs`."""
    return "*" in belongs or namespace in belongs
