"""Use cases of the whole message: what a claimer (or a tenant's console)
reads of one email: its fields, an attachment's bytes, the raw bytes.

Each reads the raw bytes once, in binary format, in a short read-only
transaction, and builds the answer after it ended: no lock is held while a
large message is scanned or hashed. Who may see the message is asked of
``app.usecases.visibility`` on every path, the claimer's included.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.db import messages as messages_db
from app.db.engine import transaction
from app.domain import whole_message
from app.domain.claiming import ClaimOutcome
from app.domain.whole_message import Attachment
from app.errors import NotFound
from app.settings import get_settings
from app.usecases import inbox, views
from app.usecases.claim_answers import Answer
from app.usecases.claims import claim_live_or_ended
from app.usecases.visibility import may_see, visible_ids


class ContentPurged(NotFound):
    code = "content_purged"
    default_message = "This message's content was purged (its mailbox was deleted)."


@dataclass(frozen=True)
class Loaded:
    """One message's summary row and its raw bytes."""

    message_id: str
    row: Mapping[str, Any]
    raw: bytes


@dataclass(frozen=True)
class AttachmentBody:
    """An attachment's description and its decoded bytes, chunk by chunk."""

    attachment: Attachment
    chunks: Iterator[bytes]


def _load(session: Connection, namespace: str, message_id: str, *, seen: bool = False) -> Loaded:
    """`seen`: the caller asked the inbox whether `namespace` may see it."""
    if not seen and not may_see(session, get_settings(), namespace, message_id):
        raise NotFound(f"no message {message_id}")
    row = messages_db.message_raw(session, message_id)
    if row is None:
        raise NotFound(f"no message {message_id}")
    if row["raw"] is None:
        raise ContentPurged()
    summary = {k: v for k, v in row.items() if k != "raw"}
    raw = row["raw"]
    return Loaded(message_id, summary, raw if isinstance(raw, bytes) else bytes(raw))


def _claimed(namespace: str, claim_id: str) -> Loaded | Answer:
    """The message of a live claim of `namespace`, or the 410 of an ended one."""
    with transaction() as session:
        claim_row, _, ended = claim_live_or_ended(session, namespace, claim_id)
        if ended is not None:
            return ended
        return _load(session, namespace, claim_row["message_id"])


def message_view(loaded: Loaded) -> dict[str, Any]:
    """The body of ``GET /v1/claims/{id}/message`` (docs/api.md)."""
    whole = whole_message.read_message(loaded.raw, loaded.message_id)
    return {
        "message_id": loaded.message_id,
        "from": whole.from_,
        "to": whole.to,
        "cc": whole.cc,
        "reply_to": whole.reply_to,
        # As matching and the claim saw it (recorded when the message was observed).
        "subject": loaded.row["subject"],
        "date": views.iso(whole.date),
        "received_at": views.iso(loaded.row["received_at"]),
        "headers": whole.headers,
        "text": whole.text,
        "html": whole.html,
        "links": whole.links,
        "codes": whole.codes,
        "attachments": [a.view() for a in whole.attachments],
        "size": whole.size,
        "sha256": whole.sha256,
    }


def claim_message(namespace: str, claim_id: str) -> Answer:
    """`GET /v1/claims/{id}/message`: 200 the whole message while the claim is live."""
    found = _claimed(namespace, claim_id)
    if isinstance(found, Answer):
        return found
    return Answer(ClaimOutcome.CLAIMED, message_view(found))


def _attachment(loaded: Loaded, attachment_id: str) -> AttachmentBody:
    found = whole_message.find_attachment(loaded.raw, loaded.message_id, attachment_id)
    if found is None:
        raise NotFound(f"no attachment {attachment_id} in message {loaded.message_id}")
    return AttachmentBody(found, whole_message.attachment_chunks(loaded.raw, found))


def claim_attachment(namespace: str, claim_id: str, attachment_id: str) -> AttachmentBody | Answer:
    """`GET /v1/claims/{id}/attachments/{attachment_id}`: the decoded bytes."""
    found = _claimed(namespace, claim_id)
    return found if isinstance(found, Answer) else _attachment(found, attachment_id)


def claim_raw(namespace: str, claim_id: str) -> Loaded | Answer:
    """`GET /v1/claims/{id}/raw`: the bytes as received."""
    return _claimed(namespace, claim_id)


# ------------------------------------------------------------------ console


def visible_message(namespace: str, message_id: str) -> Loaded:
    """A message `namespace` may see (as its inbox lists it), for the console
    and the inbox routes (NotFound otherwise). So is the mis-addressed mail
    a dead letter of the namespace names as its `recipient_typo` near miss,
    while it still belongs to nobody else (the one a developer opens to see
    the typo)."""
    try:
        inbox.message_row(namespace, message_id)
    except NotFound:
        if not _typo_near_miss(namespace, message_id):
            raise
    with transaction() as session:
        return _load(session, namespace, message_id, seen=True)


def _typo_near_miss(namespace: str, message_id: str) -> bool:
    with transaction() as session:
        return messages_db.near_miss_typo_of_namespace(
            session, namespace, message_id
        ) and message_id in visible_ids(
            session, get_settings(), namespace, [message_id], unclaimed=True
        )


def visible_attachment(namespace: str, message_id: str, attachment_id: str) -> AttachmentBody:
    return _attachment(visible_message(namespace, message_id), attachment_id)
