"""The CLI's whole-message commands: ``signalbox message CLAIM_ID`` and
``signalbox claim … --save-attachments DIR`` (see :mod:`signalbox.cli`).

Everything shown is untrusted email content: printed between the untrusted
banners, through :func:`signalbox.render.printable`; file names are reduced
to safe base names before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from signalbox import render
from signalbox.message import AsyncAttachment, Attachment, Message, safe_filename


def render_message(m: Message, saved: list[Path] | None = None) -> str:
    """Headers, text and the attachments table of a message."""
    sender = f"{m.from_.name} <{m.from_.address}>" if m.from_ else None
    head = render.fields(
        [
            ("message_id", m.message_id),
            ("size", m.size),
            ("sha256", m.sha256),
            ("received_at", m.received_at),
        ]
    )
    body = render.fields(
        [
            ("from", sender),
            ("to", [a.address for a in m.to]),
            ("cc", [a.address for a in m.cc]),
            ("subject", m.subject),
            ("date", m.date),
            ("links", [link.url for link in m.links]),
            ("codes", m.codes),
        ]
    )
    headers = render.table(["header", "value"], m.headers)
    text = render.printable(m.text) if m.text else "(no text part)"
    files = render.table(
        ["attachment_id", "filename", "content_type", "size", "sha256"],
        [(a.attachment_id, a.filename, a.content_type, a.size, a.sha256) for a in m.attachments],
    )
    out = (
        f"{head}\n{render.UNTRUSTED_BANNER}\n{body}\n\nheaders:\n{headers}\n\ntext:\n{text}\n"
        f"\nattachments:\n{files}\n{'-' * len(render.UNTRUSTED_BANNER)}"
    )
    if saved:
        out += "\nsaved:\n" + "\n".join(str(p) for p in saved)
    return out


def save_attachments(m: Message, directory: str | Path) -> list[Path]:
    """Write every attachment of ``m`` into ``directory`` (made if missing),
    each under a safe base name of its file name, a repeated name prefixed
    with its position; returns the files written."""
    where = Path(directory)
    where.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    written: list[Path] = []
    for index, attachment in enumerate(m.attachments, start=1):
        assert isinstance(attachment, Attachment) and not isinstance(attachment, AsyncAttachment)
        name = safe_filename(attachment.filename, attachment.attachment_id)
        if name in taken:
            name = f"{index}-{name}"
        taken.add(name)
        written.append(attachment.save(where / name))
    return written
