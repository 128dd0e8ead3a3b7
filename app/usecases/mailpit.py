"""Mailpit's API shapes over the inbox (§12.3): what `app/api/routes/mailpit.py`
answers, built from the inbox's rows and the whole message.

IDs are Signalbox `message_id`s; a part's `PartID` is the attachment's
`attachment_id`. Pages are Mailpit's `start`/`limit` (an offset into the
namespace's messages, newest first); messages whose content was purged are
left out, as Mailpit forgets a deleted message.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

from app.domain import whole_message
from app.errors import InvalidInput, NotFound
from app.usecases import inbox, message_content
from app.usecases.inbox import InboxFilter, query_of
from app.usecases.message_content import Loaded

VERSION = "signalbox-mailpit-1"
# Mailpit's `start` + `limit` read at most this far into a namespace's mail.
MAX_OFFSET = 10_000
STARTED = time.monotonic()


def _address(address: str | None, name: str = "") -> dict[str, str]:
    return {"Name": name, "Address": address or ""}


def list_item(row: Any) -> dict[str, Any]:
    """A message in Mailpit's list shape (`MessageSummary` of its API)."""
    return {
        "ID": row["id"],
        "MessageID": row["header_message_id"] or "",
        "Read": row["read_at"] is not None,
        "From": _address(row["from_addr"]),
        "To": [_address(a) for a in row["to_addrs"] or ()],
        "Cc": [_address(a) for a in row["cc_addrs"] or ()],
        "Bcc": [],
        "ReplyTo": [],
        "Subject": row["subject"] or "",
        "Created": _created(row),
        "Tags": [],
        "Size": row["size"],
        "Attachments": row["attachments"],
        "Snippet": "",
    }


def _created(row: Any) -> str:
    return str(row["received_at"].isoformat(timespec="milliseconds")).replace("+00:00", "Z")


def _filters(namespace: str, query: str | None) -> InboxFilter:
    return InboxFilter(namespace=namespace, query=query_of(query, "query"), include_purged=False)


def messages(namespace: str, *, query: str | None, start: int, limit: int) -> dict[str, Any]:
    """`GET /api/v1/messages` and `GET /api/v1/search`."""
    if start + limit > MAX_OFFSET:
        raise InvalidInput(f"start + limit is at most {MAX_OFFSET}", field="start")
    filters = _filters(namespace, query)
    everything = _filters(namespace, None)
    unread_q = query_of(f"{query or ''} is:unread", "query")
    # Counted before the page is read: a poller that sees `messages_count`
    # reach N finds at least those N in the page (mail arriving meanwhile
    # only adds to it).
    total = inbox.count_messages(namespace, everything)
    matching = inbox.count_messages(namespace, filters) if query else total
    unread = inbox.count_messages(namespace, _with(everything, "is:unread"))
    matching_unread = inbox.count_messages(
        namespace, InboxFilter(namespace=namespace, query=unread_q, include_purged=False)
    )
    rows = inbox.offset_rows(namespace, filters, start=start, limit=limit)
    return {
        "total": total,
        "unread": unread,
        "count": len(rows),
        "messages_count": matching,
        "messages_unread": matching_unread,
        "start": start,
        "tags": [],
        "messages": [list_item(r) for r in rows],
    }


def _with(filters: InboxFilter, term: str) -> InboxFilter:
    return InboxFilter(namespace=filters.namespace, query=query_of(term), include_purged=False)


def resolve(namespace: str, message_id: str) -> str:
    """A Mailpit ID: `latest` is the namespace's newest message."""
    if message_id != "latest":
        return message_id
    rows = inbox.offset_rows(namespace, _filters(namespace, None), start=0, limit=1)
    if not rows:
        raise NotFound("no message yet")
    return str(rows[0]["id"])


def _load(namespace: str, message_id: str) -> Loaded:
    return message_content.visible_message(namespace, resolve(namespace, message_id))


def _part(loaded: Loaded, attachment: whole_message.Attachment) -> dict[str, Any]:
    md5, sha1 = hashlib.md5(usedforsecurity=False), hashlib.sha1(usedforsecurity=False)
    for chunk in whole_message.attachment_chunks(loaded.raw, attachment):
        md5.update(chunk)
        sha1.update(chunk)
    return {
        "PartID": attachment.attachment_id,
        "FileName": attachment.filename or "",
        "ContentType": attachment.content_type,
        "ContentID": attachment.content_id or "",
        "Size": attachment.size,
        "Checksums": {
            "MD5": md5.hexdigest(),
            "SHA1": sha1.hexdigest(),
            "SHA256": attachment.sha256,
        },
    }


def summary(namespace: str, message_id: str) -> dict[str, Any]:
    """`GET /api/v1/message/{ID}`: the whole message in Mailpit's shape;
    reading it marks it read, as in Mailpit."""
    loaded = _load(namespace, message_id)
    whole = whole_message.read_message(loaded.raw, loaded.message_id)
    inbox.mark_read(namespace, [loaded.message_id], read=True)
    headers = {name.lower(): value for name, value in whole.headers}
    sender = whole.from_ or {}
    return {
        "ID": loaded.message_id,
        "MessageID": (headers.get("message-id") or "").strip().strip("<>"),
        "From": _address(sender.get("address"), sender.get("name", "")),
        "To": [_address(a["address"], a["name"]) for a in whole.to],
        "Cc": [_address(a["address"], a["name"]) for a in whole.cc],
        "Bcc": [],
        "ReplyTo": [_address(a["address"], a["name"]) for a in whole.reply_to],
        "ReturnPath": (headers.get("return-path") or "").strip().strip("<>"),
        "Subject": whole.subject,
        "ListUnsubscribe": {
            "Header": headers.get("list-unsubscribe", ""),
            "HeaderPost": headers.get("list-unsubscribe-post", ""),
            "Links": [],
            "Errors": "",
        },
        "Date": (whole.date or loaded.row["received_at"]).isoformat(),
        "Tags": [],
        "Text": whole.text,
        "HTML": whole.html,
        "Size": whole.size,
        "Inline": [_part(loaded, a) for a in whole.attachments if a.inline],
        "Attachments": [_part(loaded, a) for a in whole.attachments if not a.inline],
    }


def headers(namespace: str, message_id: str) -> dict[str, list[str]]:
    """`GET /api/v1/message/{ID}/headers`: each header name → its values."""
    loaded = _load(namespace, message_id)
    out: dict[str, list[str]] = {}
    for name, value in whole_message.read_message(loaded.raw, loaded.message_id).headers:
        out.setdefault(name, []).append(value)
    return out


def raw(namespace: str, message_id: str) -> Loaded:
    return _load(namespace, message_id)


def part(namespace: str, message_id: str, part_id: str) -> message_content.AttachmentBody:
    loaded = _load(namespace, message_id)
    return message_content.visible_attachment(namespace, loaded.message_id, part_id)


def rendering(namespace: str, message_id: str, kind: str) -> str:
    """`/view/{ID}.html` or `.txt`: the HTML or the text part as sent."""
    loaded = _load(namespace, message_id)
    whole = whole_message.read_message(loaded.raw, loaded.message_id)
    return whole.html if kind == "html" else whole.text


def set_read(namespace: str, ids: Sequence[str] | None, search: str | None, read: bool) -> None:
    """`PUT /api/v1/messages`: by IDs, else by search, else every message."""
    if ids:
        inbox.mark_read(namespace, [resolve(namespace, i) for i in ids], read=read)
        return
    filters = _filters(namespace, search)
    inbox.mark_matching(namespace, filters, read=read)


def delete(namespace: str, ids: Sequence[str] | None, search: str | None = None) -> int:
    """`DELETE /api/v1/messages` (IDs, else all) and `DELETE /api/v1/search`."""
    if ids:
        return inbox.delete_messages(namespace, [resolve(namespace, i) for i in ids])
    return inbox.delete_matching(namespace, _filters(namespace, search))


def info(namespace: str) -> dict[str, Any]:
    everything = _filters(namespace, None)
    return {
        "Version": VERSION,
        "LatestVersion": "",
        "Database": "",
        "DatabaseSize": 0,
        "Messages": inbox.count_messages(namespace, everything),
        "Unread": inbox.count_messages(namespace, _with(everything, "is:unread")),
        "Tags": {},
        "RuntimeStats": {
            "Uptime": int(time.monotonic() - STARTED),
            "MessagesDeleted": 0,
            "SMTPAccepted": 0,
            "SMTPAcceptedSize": 0,
            "SMTPRejected": 0,
            "SMTPIgnored": 0,
        },
    }


WEBUI = {
    "Label": "Signalbox",
    "MessageRelay": {
        "Enabled": False,
        "SMTPServer": "",
        "AllowedRecipients": "",
        "BlockedRecipients": "",
        "OverrideFrom": "",
        "ReturnPath": "",
        "PreserveMessageIDs": False,
        "RecipientAllowlist": "",
    },
    "SpamAssassin": False,
    "ChaosEnabled": False,
    "DuplicatesIgnored": False,
    "HideDeleteAllButton": False,
}

# Mailpit's routes Signalbox does not offer → the Signalbox equivalent.
NOT_OFFERED = {
    "send": "none: send mail to the sink over SMTP",
    "release": "none: Signalbox never relays mail",
    "html-check": "none",
    "link-check": "GET /v1/messages/{message_id} lists the links (`links`)",
    "sa-check": "none",
    "chaos": "PUT /v1/chaos (SMTP replies per recipient)",
    "tags": "none: filter by run (`run_id`) or search instead",
    "thumb": "GET /v1/messages/{message_id}/attachments/{attachment_id}",
}
