"""Use cases of mailboxes: a fresh address for a run (no earlier message can
match it), and its deletion with the messages it received."""

from __future__ import annotations

from typing import Any

from app.db import mailboxes as mailboxes_db
from app.db.engine import transaction
from app.domain import ownership
from app.domain.ids import new_id
from app.errors import NotFound, RecipientNotOwned, TooManyMailboxes
from app.settings import Settings
from app.usecases import views
from app.usecases.inputs import MailboxCreate
from app.usecases.signals import QUOTA_RETRY_AFTER_SECONDS, check_provider


def mailbox_create(settings: Settings, namespace: str, req: MailboxCreate) -> dict[str, Any]:
    """A fresh address no earlier message can match (random local part)."""
    check_provider(settings, req.provider, namespace)
    domain = settings.mailbox_domain.strip().lower()
    if not ownership.may_use(namespace, settings.namespace_domain_owners.get(domain)):
        raise RecipientNotOwned("the mailbox domain belongs to another namespace", field="provider")
    mailbox_id = new_id("mbx")
    local = f"sbx-{mailbox_id.removeprefix('mbx_')}"
    with transaction() as session:
        limit = settings.max_mailboxes_per_namespace
        if mailboxes_db.mailbox_live_count(session, namespace) >= limit:
            raise TooManyMailboxes(
                f"this namespace already has {limit} live mailboxes"
                " (SIGNALBOX_MAX_MAILBOXES_PER_NAMESPACE); delete some, or let them expire",
                retry_after_seconds=QUOTA_RETRY_AFTER_SECONDS,
            )
        row = mailboxes_db.mailbox_insert(
            session,
            {
                "id": mailbox_id,
                "namespace": namespace,
                "run_id": req.run_id,
                "provider": req.provider,
                "address": f"{local}@{domain}",
                "ttl": settings.mailbox_ttl_hours * 3600.0,
            },
        )
    return views.mailbox_view(row)


def foreign_domains(settings: Settings, namespace: str) -> list[str]:
    """The domains namespaces other than `namespace` own."""
    return [d for d, ns in settings.namespace_domain_owners.items() if ns != namespace]


def mailbox_delete(settings: Settings, namespace: str, mailbox_id: str) -> None:
    """Delete the mailbox and purge the mail that belongs to `namespace`
    alone (mail another namespace may see, or a signal still waits on or
    points at, stays until retention)."""
    with transaction() as session:
        row = mailboxes_db.mailbox_delete(session, mailbox_id, namespace)
        if row is None:
            raise NotFound(f"no mailbox {mailbox_id}")
        mailboxes_db.mailbox_purge_messages(
            session, row["address"], namespace, foreign_domains(settings, namespace)
        )
