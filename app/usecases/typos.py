"""Domain typos, warned about on create: a recipient whose domain is one or
two edits from a well-known mail domain or one this deployment serves.
(Recipient typos, looked for at expiry, are `app.usecases.checks.recipient_typos`.)"""

from __future__ import annotations

from app.domain.typos import WELL_KNOWN_DOMAINS, domain_suggestion
from app.settings import Settings


def recipient_warnings(settings: Settings, recipient: str) -> list[dict[str, str]]:
    """The create answer's warnings about `recipient`: `domain_typo` when its
    domain is one or two edits from a well-known mail domain or a domain this
    deployment's sink serves (an exact one gets none)."""
    known = (
        *sorted(settings.accepted_domains),
        settings.mailbox_domain,
        *sorted(settings.namespace_domain_owners),
        *WELL_KNOWN_DOMAINS,
    )
    suggestion = domain_suggestion(recipient, known)
    if suggestion is None:
        return []
    return [{"code": "domain_typo", "field": "recipient", "suggestion": suggestion}]
