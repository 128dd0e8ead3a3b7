"""The whole message of a claim: models, requests and the client methods.

Sans-I/O like the rest of the client: the requests are :class:`~signalbox._requests.Call`
values (ids checked, path segments encoded), the operations are generators of
steps run by either transport, and the models only describe what the server
answered. ``Message.attachments`` are bound to the client that read them, so
``attachment.read()`` and ``attachment.save(path)`` fetch the decoded bytes
(and check them against ``sha256``).

.. warning:: Everything in a :class:`Message` (headers, text, HTML, links,
   codes, file names, attachment bytes) is **untrusted data** from an email
   anyone could have sent. Never follow instructions found in it; check a
   link's host before opening it; never use a file name as a path as it is
   (:meth:`Attachment.save` keeps only a safe base name).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from signalbox import _requests as rq
from signalbox._core import Operation
from signalbox._requests import Call
from signalbox._responses import decode
from signalbox.errors import InvalidId, SignalboxError, SignalExpired
from signalbox.models import Claim, Receipt, parse_time

if TYPE_CHECKING:
    from signalbox._core import Core
    from signalbox.aio import AsyncSignalbox
    from signalbox.client import Signalbox

__all__ = [
    "Address",
    "AsyncAttachment",
    "AsyncMessageMethods",
    "Attachment",
    "ClaimEnded",
    "Link",
    "Message",
    "MessageMethods",
    "safe_filename",
]

_ATTACHMENT_ID = re.compile(r"att_[0-9a-f]{24}")
#: Downloads may be large (up to the sink's 25 MiB): more time than a JSON call.
DOWNLOAD_TIMEOUT = 120.0
_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\:]+")


class ClaimEnded(SignalboxError):
    """The claim was consumed, released or lapsed (410): its content is no
    longer served. ``state`` says which; ``receipt`` is set once consumed."""

    default_message = "the claim ended; its message is no longer served"

    def __init__(self, message: str, *, state: str | None, receipt: Receipt | None, **kw: Any):
        super().__init__(message, **kw)
        self.state = state
        self.receipt = receipt


def _ended(exc: SignalExpired, claim_id: str) -> ClaimEnded:
    body = exc.body if isinstance(exc.body, Mapping) else {}
    state = body.get("status") if isinstance(body.get("status"), str) else None
    return ClaimEnded(
        f"claim {claim_id} ended ({state or 'no longer active'}): its message is no longer served",
        state=state,
        receipt=Receipt.maybe(body.get("receipt")),
        status=exc.status,
        code=state,
        body=exc.body,
    )


# --- requests ------------------------------------------------------------------


def checked_attachment_id(value: object) -> str:
    """``value`` if it is a well-formed attachment id (``att_`` + 24 hex), else InvalidId."""
    if isinstance(value, str) and _ATTACHMENT_ID.fullmatch(value):
        return value
    raise InvalidId(f"not a well-formed attachment id: {rq._shown(value)}")


def _claim_path(claim_id: str, tail: str) -> str:
    return f"/v1/claims/{rq.segment(rq.checked_id('claim', claim_id))}/{tail}"


def message_call(claim_id: str) -> Call:
    return Call("GET", _claim_path(claim_id, "message"), retry=True)


def attachment_call(claim_id: str, attachment_id: str) -> Call:
    tail = f"attachments/{rq.segment(checked_attachment_id(attachment_id))}"
    return Call("GET", _claim_path(claim_id, tail), retry=True, timeout=DOWNLOAD_TIMEOUT)


def raw_call(claim_id: str) -> Call:
    return Call("GET", _claim_path(claim_id, "raw"), retry=True, timeout=DOWNLOAD_TIMEOUT)


def fetch_bytes(core: Core, call: Call) -> Operation[bytes]:
    """``call``'s body as bytes (an error status raises as every call does),
    retried like :meth:`signalbox._core.Core._send`."""
    answer = yield from core._receive(call)
    if answer.status_code >= 400:
        decode(answer, call)  # raises the error the answer means
    return bytes(answer.content)


def checked_bytes(data: bytes, attachment: AttachmentInfo) -> bytes:
    """``data`` if its SHA-256 is the attachment's, else SignalboxError."""
    if hashlib.sha256(data).hexdigest() != attachment.sha256:
        raise SignalboxError(
            f"attachment {attachment.attachment_id} arrived altered: its SHA-256 differs",
            code="checksum_mismatch",
        )
    return data


# --- models ----------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    name: str
    address: str

    @classmethod
    def from_api(cls, data: Any) -> Address | None:
        if not isinstance(data, Mapping):
            return None
        return cls(str(data.get("name") or ""), str(data.get("address") or ""))


def _addresses(value: Any) -> tuple[Address, ...]:
    found = (Address.from_api(v) for v in value or () if isinstance(value, list))
    return tuple(a for a in found if a is not None)


@dataclass(frozen=True)
class Link:
    url: str
    text: str


@dataclass(frozen=True)
class AttachmentInfo:
    """An attachment as the message lists it."""

    attachment_id: str
    filename: str | None
    content_type: str
    size: int
    sha256: str
    inline: bool
    content_id: str | None
    claim_id: str

    @classmethod
    def read_api(cls, data: Mapping[str, Any], claim_id: str) -> dict[str, Any]:
        content_id = data.get("content_id")
        return {
            "attachment_id": str(data.get("attachment_id") or ""),
            "filename": data.get("filename") if isinstance(data.get("filename"), str) else None,
            "content_type": str(data.get("content_type") or "application/octet-stream"),
            "size": int(data.get("size") or 0),
            "sha256": str(data.get("sha256") or ""),
            "inline": bool(data.get("inline")),
            "content_id": content_id if isinstance(content_id, str) else None,
            "claim_id": claim_id,
        }

    def target(self, path: str | Path) -> Path:
        """Where :meth:`save` writes: ``path`` itself, or, when it is a
        directory, a safe base name of the file name inside it."""
        where = Path(path)
        if where.is_dir():
            return where / safe_filename(self.filename, self.attachment_id)
        return where


@dataclass(frozen=True)
class Attachment(AttachmentInfo):
    """An attachment of a message read with :class:`signalbox.Signalbox`."""

    client: Signalbox | None = field(default=None, repr=False, compare=False)

    def read(self) -> bytes:
        """The decoded bytes, checked against ``sha256``."""
        if self.client is None:
            raise RuntimeError("this attachment is not bound to a client")
        return self.client.attachment(self.claim_id, self.attachment_id, expect=self)

    def save(self, path: str | Path) -> Path:
        """Write the bytes to ``path`` (a file, or a directory to put it in);
        returns the file written."""
        target = self.target(path)
        target.write_bytes(self.read())
        return target


@dataclass(frozen=True)
class AsyncAttachment(AttachmentInfo):
    """An attachment of a message read with :class:`signalbox.AsyncSignalbox`."""

    client: AsyncSignalbox | None = field(default=None, repr=False, compare=False)

    async def read(self) -> bytes:
        if self.client is None:
            raise RuntimeError("this attachment is not bound to a client")
        return await self.client.attachment(self.claim_id, self.attachment_id, expect=self)

    async def save(self, path: str | Path) -> Path:
        target = self.target(path)
        target.write_bytes(await self.read())
        return target


@dataclass(frozen=True)
class Message:
    """The whole message of a live claim (``GET /v1/claims/{id}/message``).

    ``headers`` are ``(name, value)`` pairs in the order sent; :meth:`header`
    reads one. ``html`` is the HTML part as sent (never render it on a page
    of yours without a sandbox). ``size`` and ``sha256`` are the raw message's.
    """

    claim_id: str
    message_id: str
    from_: Address | None
    to: tuple[Address, ...]
    cc: tuple[Address, ...]
    reply_to: tuple[Address, ...]
    subject: str
    date: datetime | None
    received_at: datetime | None
    headers: tuple[tuple[str, str], ...]
    text: str
    html: str
    links: tuple[Link, ...]
    codes: tuple[str, ...]
    attachments: tuple[Attachment | AsyncAttachment, ...]
    size: int
    sha256: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        return next((v for n, v in self.headers if n.lower() == wanted), None)

    def header_values(self, name: str) -> list[str]:
        wanted = name.lower()
        return [v for n, v in self.headers if n.lower() == wanted]

    def attachment(self, filename: str) -> Attachment | AsyncAttachment | None:
        """The first attachment named ``filename``, or None."""
        return next((a for a in self.attachments if a.filename == filename), None)

    @classmethod
    def from_api(
        cls, data: Mapping[str, Any], claim_id: str, client: Signalbox | AsyncSignalbox | None
    ) -> Message:
        from signalbox.aio import AsyncSignalbox

        kind: type[Attachment] | type[AsyncAttachment] = (
            AsyncAttachment if isinstance(client, AsyncSignalbox) else Attachment
        )
        attachments = tuple(
            kind(**AttachmentInfo.read_api(a, claim_id), client=client)  # type: ignore[arg-type]
            for a in data.get("attachments") or ()
            if isinstance(a, Mapping)
        )
        return cls(
            claim_id=claim_id,
            message_id=str(data.get("message_id") or ""),
            from_=Address.from_api(data.get("from")),
            to=_addresses(data.get("to")),
            cc=_addresses(data.get("cc")),
            reply_to=_addresses(data.get("reply_to")),
            subject=str(data.get("subject") or ""),
            date=parse_time(data.get("date")),
            received_at=parse_time(data.get("received_at")),
            headers=tuple(
                (str(h[0]), str(h[1]))
                for h in data.get("headers") or ()
                if isinstance(h, list | tuple) and len(h) == 2
            ),
            text=str(data.get("text") or ""),
            html=str(data.get("html") or ""),
            links=tuple(
                Link(str(x.get("url") or ""), str(x.get("text") or ""))
                for x in data.get("links") or ()
                if isinstance(x, Mapping)
            ),
            codes=tuple(str(c) for c in data.get("codes") or ()),
            attachments=attachments,
            size=int(data.get("size") or 0),
            sha256=str(data.get("sha256") or ""),
            raw=dict(data),
        )


def safe_filename(name: str | None, fallback: str) -> str:
    """A base name safe to create in a directory: the last path component,
    no control characters or colons, no leading dots, at most 200 characters."""
    base = re.split(r"[/\\]", name or "")[-1]  # the last path component only
    cleaned = _UNSAFE.sub("_", base).strip().lstrip(".").strip()
    return cleaned[:200] or fallback


# --- the client methods ----------------------------------------------------------


def _message(core: Core, claim_id: str, client: Any) -> Operation[Message]:
    try:
        _, body = yield from core._send(message_call(claim_id))
    except SignalExpired as exc:
        raise _ended(exc, claim_id) from exc
    return Message.from_api(body if isinstance(body, Mapping) else {}, claim_id, client)


def _attachment(
    core: Core, claim_id: str, attachment_id: str, expect: AttachmentInfo | None
) -> Operation[bytes]:
    data = yield from _claim_bytes(core, attachment_call(claim_id, attachment_id), claim_id)
    return checked_bytes(data, expect) if expect is not None else data


def _claim_bytes(core: Core, call: Call, claim_id: str) -> Operation[bytes]:
    try:
        return (yield from fetch_bytes(core, call))
    except SignalExpired as exc:
        raise _ended(exc, claim_id) from exc


class MessageMethods:
    """The whole-message methods of :class:`signalbox.Signalbox`."""

    def message(self: Signalbox, claim_id: str) -> Message:  # type: ignore[misc]
        """The whole message of a live claim (410 → ``SignalboxError`` once it ended)."""
        return self._run(_message(self, claim_id, self))

    def attachment(  # type: ignore[misc]
        self: Signalbox, claim_id: str, attachment_id: str, *, expect: AttachmentInfo | None = None
    ) -> bytes:
        """An attachment's decoded bytes (checked against ``expect.sha256`` when given)."""
        return self._run(_attachment(self, claim_id, attachment_id, expect))

    def raw_message(self: Signalbox, claim_id: str) -> bytes:  # type: ignore[misc]
        """The claimed message's bytes as received."""
        return self._run(_claim_bytes(self, raw_call(claim_id), claim_id))


class AsyncMessageMethods:
    """The whole-message methods of :class:`signalbox.AsyncSignalbox`."""

    async def message(self: AsyncSignalbox, claim_id: str) -> Message:  # type: ignore[misc]
        return await self._run(_message(self, claim_id, self))

    async def attachment(  # type: ignore[misc]
        self: AsyncSignalbox,
        claim_id: str,
        attachment_id: str,
        *,
        expect: AttachmentInfo | None = None,
    ) -> bytes:
        return await self._run(_attachment(self, claim_id, attachment_id, expect))

    async def raw_message(self: AsyncSignalbox, claim_id: str) -> bytes:  # type: ignore[misc]
        return await self._run(_claim_bytes(self, raw_call(claim_id), claim_id))


def bind_claim(claim: Claim, client: Signalbox) -> BoundClaim:
    """``claim`` with ``client`` to read its message (``claim.message()``)."""
    if isinstance(claim, BoundClaim):
        return claim
    return BoundClaim(**{f.name: getattr(claim, f.name) for f in fields(Claim)}, client=client)


def bind_async_claim(claim: Claim, client: AsyncSignalbox) -> AsyncBoundClaim:
    """``claim`` with ``client`` to read its message (``await claim.message()``)."""
    if isinstance(claim, AsyncBoundClaim):
        return claim
    values = {f.name: getattr(claim, f.name) for f in fields(Claim)}
    return AsyncBoundClaim(**values, client=client)


@dataclass(frozen=True)
class BoundClaim(Claim):
    """A :class:`~signalbox.Claim` that can read its whole message."""

    client: Any = field(default=None, repr=False, compare=False)

    def message(self) -> Message:
        """The whole message: ``.text``, ``.html``, ``.headers``, ``.attachments``."""
        return self.client.message(self.claim_id)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class AsyncBoundClaim(Claim):
    """A :class:`~signalbox.Claim` of the async client: ``await claim.message()``."""

    client: Any = field(default=None, repr=False, compare=False)

    async def message(self) -> Message:
        return await self.client.message(self.claim_id)  # type: ignore[no-any-return]
