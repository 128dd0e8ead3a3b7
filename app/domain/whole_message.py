"""The whole message a claimer may read: headers, bodies, links, attachments.

Pure: raw bytes in, values out, never raising. Built on the linear scan of
``app.domain.mail.structure`` (no stdlib MIME tree, no copy of a body), so a
25 MiB message costs its raw bytes, its decoded text parts and one chunk of
an attachment at a time. docs/api.md, "The whole message", is the reference.

Which leaf parts are what: the message's text and HTML are its first
``text/plain`` and first ``text/html`` leaf that is not
``Content-Disposition: attachment`` (as matching reads them, see
``app.domain.mail.mime``); every other leaf is an attachment, except further
inline text parts without a file name (a list's footer) and a multipart left
unsplit. An attachment's id is ``att_`` and 24 hex of SHA-256 over the
message's id and the part's section number: stable for the message, opaque,
and checkable by its shape (:data:`ATTACHMENT_ID_PATTERN`).
"""

from __future__ import annotations

import email.utils
import hashlib
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.domain.extract import Extracted, extract
from app.domain.mail import ParsedMail, normalize_whitespace
from app.domain.mail.addresses import bare_address, fallback_addresses
from app.domain.mail.charset import clean_text, decode_bytes, decode_raw_header
from app.domain.mail.html import html_anchors
from app.domain.mail.mime import RUN_MARKER_HEADERS
from app.domain.mail.structure import Part, Structure, decoded_chunks, scan

__all__ = [
    "ATTACHMENT_ID_PATTERN",
    "Attachment",
    "WholeMessage",
    "attachment_chunks",
    "attachment_id",
    "attachments",
    "claim_content",
    "digest",
    "find_attachment",
    "read_message",
]

ATTACHMENT_ID_PATTERN = r"^att_[0-9a-f]{24}$"
_MAX_ADDRESS_HEADER = 4096  # longer address headers are read without display names


@dataclass(frozen=True)
class Attachment:
    """One attachment: what the message route lists, and the part it is."""

    attachment_id: str
    filename: str | None
    content_type: str
    size: int
    sha256: str
    inline: bool
    content_id: str | None
    part: Part

    def view(self) -> dict[str, Any]:
        return {
            "attachment_id": self.attachment_id,
            "filename": self.filename,
            "content_type": self.content_type,
            "size": self.size,
            "sha256": self.sha256,
            "inline": self.inline,
            "content_id": self.content_id,
        }


@dataclass(frozen=True)
class WholeMessage:
    """The fields of ``GET /v1/claims/{id}/message`` that come from the bytes."""

    headers: list[list[str]]
    from_: dict[str, str] | None
    to: list[dict[str, str]]
    cc: list[dict[str, str]]
    reply_to: list[dict[str, str]]
    subject: str
    date: datetime | None
    text: str
    html: str
    links: list[dict[str, str]]
    codes: list[str]
    attachments: list[Attachment]
    size: int
    sha256: str
    truncated: bool


def attachment_id(message_id: str, section: str) -> str:
    return "att_" + hashlib.sha256(f"{message_id}:{section}".encode()).hexdigest()[:24]


def _bodies(structure: Structure) -> tuple[Part | None, Part | None]:
    text = html = None
    for part in structure.leaves:
        if part.content_type not in ("text/plain", "text/html"):
            continue
        if part.disposition == "attachment":
            continue
        if part.content_type == "text/plain" and text is None:
            text = part
        elif part.content_type == "text/html" and html is None:
            html = part
    return text, html


def _attachment_parts(structure: Structure) -> Iterator[Part]:
    bodies = {p.section for p in _bodies(structure) if p is not None}
    for part in structure.leaves:
        if part.section in bodies:
            continue
        if part.content_type.startswith("multipart/"):
            continue  # a multipart without a usable delimiter: no file in it
        if (
            part.content_type.startswith("text/")
            and part.filename is None
            and part.disposition != "attachment"
        ):
            continue
        yield part


def _measured(raw: bytes, message_id: str, part: Part) -> Attachment:
    hasher = hashlib.sha256()
    size = 0
    for chunk in decoded_chunks(raw, part):
        hasher.update(chunk)
        size += len(chunk)
    inline = part.disposition == "inline" or (part.disposition is None and bool(part.content_id))
    return Attachment(
        attachment_id=attachment_id(message_id, part.section),
        filename=part.filename,
        content_type=part.content_type,
        size=size,
        sha256=hasher.hexdigest(),
        inline=inline,
        content_id=part.content_id,
        part=part,
    )


def attachments(
    raw: bytes, message_id: str, structure: Structure | None = None
) -> list[Attachment]:
    """Every attachment of the message, decoded once each to be measured."""
    structure = structure or scan(raw)
    return [_measured(raw, message_id, p) for p in _attachment_parts(structure)]


def attachment_count(raw: bytes) -> int:
    """How many attachments the message has (none decoded: the linear scan only)."""
    return sum(1 for _ in _attachment_parts(scan(raw)))


def find_attachment(raw: bytes, message_id: str, wanted: str) -> Attachment | None:
    """The attachment whose id is ``wanted``, measured; None when there is none."""
    for part in _attachment_parts(scan(raw)):
        if attachment_id(message_id, part.section) == wanted:
            return _measured(raw, message_id, part)
    return None


def attachment_chunks(raw: bytes, attachment: Attachment) -> Iterator[bytes]:
    """The attachment's decoded bytes, a chunk at a time."""
    return decoded_chunks(raw, attachment.part)


def digest(raw: bytes, message_id: str) -> dict[str, Any]:
    """What a receipt's evidence pins of the message: the raw bytes' SHA-256
    and each attachment's file name (unmasked: the caller masks), type, size
    and SHA-256. No content."""
    return {
        "message_sha256": hashlib.sha256(raw).hexdigest(),
        "attachments": [
            {
                "filename": a.filename,
                "content_type": a.content_type,
                "size": a.size,
                "sha256": a.sha256,
            }
            for a in attachments(raw, message_id)
        ],
    }


def claim_content(raw: bytes) -> Extracted:
    """The excerpt, links and codes a claim answers, read with the linear scan:
    the same as ``extract(parse_mail(raw))`` for well-formed mail, without the
    stdlib's MIME tree (a few copies of a 25 MiB message less)."""
    return extract(_mail_of(scan(raw), raw)[0])


def _mail_of(structure: Structure, raw: bytes) -> tuple[ParsedMail, list[dict[str, str]]]:
    """The decoded view matching and extraction read, and the From addresses."""
    root = structure.root
    text_part, html_part = _bodies(structure)
    text = _body_text(raw, text_part)
    html = _body_text(raw, html_part)
    subject = unicodedata.normalize("NFC", normalize_whitespace(_first(root, "subject") or ""))
    senders = _addresses(root, "from")
    to, cc = _addresses(root, "to"), _addresses(root, "cc")
    marker = next((v for h in RUN_MARKER_HEADERS if (v := _first(root, h.lower()))), None)
    mail = ParsedMail(
        subject=subject,
        to=tuple(a["address"] for a in to),
        cc=tuple(a["address"] for a in cc),
        from_addr=senders[0]["address"] if senders else None,
        message_id_header=_first(root, "message-id"),
        run_marker=marker.strip() if marker else None,
        text=text,
        html=html,
    )
    return mail, senders


def read_message(raw: bytes, message_id: str) -> WholeMessage:
    """The whole message of ``raw`` (recorded as ``message_id``)."""
    structure = scan(raw)
    root = structure.root
    mail, senders = _mail_of(structure, raw)
    content = extract(mail)
    anchors: dict[str, str] = {}
    for url, words in html_anchors(mail.html):
        anchors.setdefault(url, words)
    return WholeMessage(
        headers=[[name, value] for name, value in root.headers],
        from_=senders[0] if senders else None,
        to=_addresses(root, "to"),
        cc=_addresses(root, "cc"),
        reply_to=_addresses(root, "reply-to"),
        subject=mail.subject,
        date=_date(_first(root, "date")),
        text=mail.text,
        html=mail.html,
        links=[{"url": url, "text": anchors.get(url, "")} for url in content.links],
        codes=list(content.codes),
        attachments=attachments(raw, message_id, structure),
        size=len(raw),
        sha256=hashlib.sha256(raw).hexdigest(),
        truncated=structure.truncated,
    )


def _first(part: Part, name: str) -> str | None:
    return next((v for n, v in part.headers if n.lower() == name), None)


def _body_text(raw: bytes, part: Part | None) -> str:
    """A text part decoded as matching decodes it: transfer encoding, then
    its charset (with fallbacks), line endings made ``\\n``."""
    if part is None:
        return ""
    data = b"".join(decoded_chunks(raw, part))
    text = decode_bytes(data, part.charset, [])
    del data
    return clean_text(text.replace("\r\n", "\n").replace("\r", "\n"))


def _addresses(part: Part, name: str) -> list[dict[str, str]]:
    """``[{"name", "address"}]`` of every such header: display names decoded,
    addresses lower-cased; an address header too long to split safely is
    read for its addresses alone."""
    values = [
        v for (n, _), v in zip(part.headers, part.raw_values, strict=True) if n.lower() == name
    ]
    found: list[dict[str, str]] = []
    for value in values:
        if len(value) > _MAX_ADDRESS_HEADER:
            pairs = [("", a) for a in fallback_addresses([clean_text(value)])]
        else:
            try:
                pairs = email.utils.getaddresses([value])
            except Exception:  # deeply nested comments overflow its recursion
                pairs = [("", a) for a in fallback_addresses([clean_text(value)])]
        for display, address in pairs:
            bare = bare_address(address)
            if bare:
                shown = normalize_whitespace(decode_raw_header(display)) if display else ""
                found.append({"name": shown, "address": bare})
    return found


_DATE_MAX = 256
_SPACES = re.compile(r"\s+")


def _date(value: str | None) -> datetime | None:
    """The Date header as a UTC instant (a date without a zone read as UTC);
    None when absent or unreadable."""
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(_SPACES.sub(" ", value[:_DATE_MAX]))
    except Exception:
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except (OverflowError, ValueError):
        return None
