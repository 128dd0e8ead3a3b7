"""MailDev provider: reads the messages a MailDev instance caught, over its REST API.

MailDev (the npm package, 2.x) answers ``GET /email`` with every stored
message as parsed JSON and ``GET /email/{id}/source`` with the raw ``.eml``.
Its ``id`` is the provider message id. Its ``time`` field is the message's
``Date`` header when there is one, else the moment MailDev received it; so,
unlike IMAP's INTERNALDATE, the received time of a MailDev message is as good
as the sender's clock. ``envelope.to`` holds the SMTP ``RCPT TO`` addresses.

The listing also carries the parsed ``To``/``Cc`` addresses and the decoded
headers, so a look downloads the raw source only of the messages that may be
addressed to one of its recipients inside that recipient's span (its window,
or the near-miss lookback just before it; `app.providers.narrowing`): mail to
other recipients costs nothing but its line in the listing. One HTTP client
(keep-alive) serves every request of a look, and the next looks.

Errors:

============================================  ===================  ======================
what happened                                 raised               ``error_code``
============================================  ===================  ======================
connection refused                            ProviderUnavailable  ``connection_refused``
timeout (connect, read, write, pool)          ProviderUnavailable  ``timeout``
connection dropped, other transport errors    ProviderUnavailable  ``maildev_unavailable``
HTTP 5xx                                      ProviderUnavailable  ``http_5xx``
HTTP 429 (``retry_after`` from Retry-After)   ProviderUnavailable  ``rate_limited``
invalid JSON, or JSON of the wrong shape      ProviderUnavailable  ``bad_response``
HTTP 401 / 403                                ProviderRejected     ``auth_failed``
HTTP 404 on the list (wrong base URL)         ProviderRejected     ``not_found``
other HTTP 4xx                                ProviderRejected     ``http_4xx``
============================================  ===================  ======================

A message deleted between the list and its source (404 on the source) is
skipped, not an error.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

from app.errors import ProviderError, ProviderRejected, ProviderUnavailable
from app.providers.base import WHOLE_SECONDS, ProviderMessage, SearchQuery
from app.providers.narrowing import (
    BEFORE_WINDOW_PER_RECIPIENT,
    Narrowing,
    Span,
    header_forms,
    named_in,
    narrowing,
)

log = logging.getLogger(__name__)

SOURCE_CACHE_ENTRIES = 2000
SOURCE_CACHE_BYTES = 64 * 1024 * 1024


class MaildevProvider:
    """Reads messages from a MailDev server's REST API.

    `url` is MailDev's web address including any ``--base-pathname``
    (``http://127.0.0.1:1080``). `username`/`password` are MailDev's
    ``--web-user``/``--web-pass``, when it has them. One HTTP client (and its
    keep-alive connections) is reused across calls; `close()` releases it and
    a later `search` opens a new one.
    """

    type = "maildev"
    # `time` is the Date header when present: one-second resolution.
    timestamp_precision = WHOLE_SECONDS
    pushes = False

    def __init__(
        self,
        name: str,
        url: str,
        timeout: float = 5.0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.username = username
        self._password = password
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        # MailDev never changes a message under its id: sources already read
        # are kept (bounded), so a check costs one list call plus one call per
        # new message instead of one per message in the mailbox.
        self._sources: OrderedDict[str, bytes] = OrderedDict()
        self._sources_bytes = 0

    def __repr__(self) -> str:
        return f"MaildevProvider(name={self.name!r}, url={self.url!r})"

    # -- the Provider protocol -------------------------------------------------

    def search(self, query: SearchQuery) -> Sequence[ProviderMessage]:
        """The messages that may be addressed to `query.recipients` inside their
        spans (all since `query.since` for a query without recipients), oldest first.

        ``time`` usually comes from the Date header (one-second resolution),
        so windows are compared floored to the second.
        """
        plan = narrowing(query.since, query.recipients, query.windows, self.timestamp_precision)
        with self._lock:
            listed = _parse_list(self._get_json("/email"))
            messages: list[ProviderMessage] = []
            for entry in _wanted(listed, plan):
                raw = self._get_source(entry.id)
                if raw is None:
                    continue
                messages.append(
                    ProviderMessage(
                        provider_message_id=entry.id,
                        received_at=entry.received_at,
                        raw=raw,
                        envelope_recipients=entry.recipients,
                    )
                )
            messages.sort(key=lambda m: (m.received_at, m.provider_message_id))
            return messages

    def close(self) -> None:
        """Close the HTTP client; the next `search` opens a new one."""
        with self._lock:
            client, self._client = self._client, None
            if client is not None:
                client.close()

    # -- internals -------------------------------------------------------------

    def _http(self) -> httpx.Client:
        if self._client is None:
            auth = None
            if self.username is not None:
                auth = httpx.BasicAuth(self.username, self._password or "")
            self._client = httpx.Client(
                base_url=self.url,
                timeout=self.timeout,
                auth=auth,
                headers={"Accept": "application/json"},
                # MailDev never redirects its API; a redirect means a wrong URL.
                follow_redirects=False,
            )
        return self._client

    def _request(self, path: str) -> httpx.Response:
        try:
            return self._http().get(path)
        except httpx.TimeoutException as exc:
            raise ProviderUnavailable(
                f"MailDev at {self.url} timed out", error_code="timeout"
            ) from exc
        except httpx.TransportError as exc:
            # The pooled connection may be the broken part: start afresh next time.
            self._reset_client()
            if _caused_by(exc, ConnectionRefusedError):
                raise ProviderUnavailable(
                    f"MailDev at {self.url} refused the connection",
                    error_code="connection_refused",
                ) from exc
            raise ProviderUnavailable(
                f"MailDev at {self.url} is unreachable ({type(exc).__name__})",
                error_code="maildev_unavailable",
            ) from exc

    def _get_json(self, path: str) -> object:
        response = self._request(path)
        self._raise_for_status(response, listing=True)
        try:
            return response.json()
        except ValueError:
            # `from None`: the decoder's message quotes the body.
            raise ProviderUnavailable(
                f"MailDev at {self.url} answered {path} with invalid JSON",
                error_code="bad_response",
            ) from None

    def _get_source(self, message_id: str) -> bytes | None:
        cached = self._sources.get(message_id)
        if cached is not None:
            self._sources.move_to_end(message_id)
            return cached
        response = self._request(f"/email/{quote(message_id, safe='')}/source")
        if response.status_code == 404:
            log.debug("maildev provider %s: message vanished before its source was read", self.name)
            return None
        self._raise_for_status(response, listing=False)
        raw = response.content
        self._remember(message_id, raw)
        return raw

    def _remember(self, message_id: str, raw: bytes) -> None:
        self._sources[message_id] = raw
        self._sources_bytes += len(raw)
        while self._sources and (
            len(self._sources) > SOURCE_CACHE_ENTRIES or self._sources_bytes > SOURCE_CACHE_BYTES
        ):
            _, dropped = self._sources.popitem(last=False)
            self._sources_bytes -= len(dropped)

    def _raise_for_status(self, response: httpx.Response, *, listing: bool) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        error: ProviderError
        if status == 429:
            error = ProviderUnavailable(
                f"MailDev at {self.url} is rate limiting",
                error_code="rate_limited",
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )
        elif status >= 500:
            error = ProviderUnavailable(
                f"MailDev at {self.url} answered HTTP {status}",
                error_code="http_5xx",
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )
        elif status in (401, 403):
            error = ProviderRejected(
                f"MailDev at {self.url} refused the credentials (HTTP {status})",
                error_code="auth_failed",
            )
        elif status == 404 and listing:
            error = ProviderRejected(
                f"MailDev at {self.url} has no /email route: check the URL and base path",
                error_code="not_found",
            )
        elif 300 <= status < 400:
            error = ProviderRejected(
                f"MailDev at {self.url} redirected (HTTP {status}): check the URL",
                error_code="http_3xx",
            )
        else:
            error = ProviderRejected(
                f"MailDev at {self.url} answered HTTP {status}", error_code="http_4xx"
            )
        raise error

    def _reset_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


class _Listed:
    """The part of a `GET /email` entry this provider uses.

    `recipients` are the envelope's (RCPT TO); `addresses` adds the parsed
    To and Cc; `headers` holds the `header_forms` of the decoded To and Cc
    headers (of "" when there are none), or None when the entry does not say
    (then the message may be addressed to anyone).
    """

    __slots__ = ("addresses", "headers", "id", "received_at", "recipients")

    def __init__(
        self,
        id: str,
        received_at: datetime,
        recipients: tuple[str, ...],
        addresses: frozenset[str] = frozenset(),
        headers: tuple[str, ...] | None = None,
    ) -> None:
        self.id = id
        self.received_at = received_at
        self.recipients = recipients
        self.addresses = addresses
        self.headers = headers

    def names(self, span: Span) -> bool:
        """Whether this message may be addressed to the span's recipient."""
        if not span.searchable or self.headers is None:
            return True
        return span.recipient in self.addresses or named_in(span.recipient, self.headers)


def _wanted(listed: Sequence[_Listed], plan: Narrowing) -> list[_Listed]:
    """The entries whose source a look needs: each addressed to a recipient
    at or after its window, plus that recipient's latest few near misses."""
    if not plan.narrowed:
        return [e for e in listed if e.received_at >= plan.since]
    keep: dict[str, _Listed] = {}
    before: dict[str, list[_Listed]] = {}
    for entry in listed:
        if entry.received_at < plan.since:
            continue
        for span in plan.spans:
            if entry.received_at < span.start or not entry.names(span):
                continue
            if entry.received_at >= span.window:
                keep[entry.id] = entry
                break
            before.setdefault(span.recipient, []).append(entry)
    for near in before.values():
        near.sort(key=lambda e: (e.received_at, e.id))
        for entry in near[-BEFORE_WINDOW_PER_RECIPIENT:]:
            keep.setdefault(entry.id, entry)
    return list(keep.values())


def _parse_list(payload: object) -> list[_Listed]:
    if not isinstance(payload, list):
        raise _bad_shape("the message list is not a JSON array")
    return [_parse_entry(item) for item in payload]


def _parse_entry(item: object) -> _Listed:
    if not isinstance(item, Mapping):
        raise _bad_shape("a message list entry is not an object")
    message_id = item.get("id")
    if not isinstance(message_id, str) or not message_id:
        raise _bad_shape("a message has no string id")
    stamp = item.get("time") or item.get("date")
    if not isinstance(stamp, str):
        raise _bad_shape("a message has no time")
    try:
        received_at = datetime.fromisoformat(stamp)
    except ValueError:
        raise _bad_shape("a message time is not ISO 8601") from None
    if received_at.tzinfo is None:
        # MailDev serialises JavaScript Dates, always in UTC ("...Z").
        received_at = received_at.replace(tzinfo=UTC)
    envelope = _envelope_recipients(item)
    parsed = {*envelope, *_addresses(item.get("to")), *_addresses(item.get("cc"))}
    return _Listed(
        message_id,
        received_at.astimezone(UTC),
        envelope,
        frozenset(parsed),
        _header_text(item.get("headers")),
    )


def _addresses(value: object) -> list[str]:
    """The lower-cased addresses of a parsed address list ([{address, name}])."""
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, list):
        return []
    found: list[str] = []
    for entry in value:
        address = entry.get("address") if isinstance(entry, Mapping) else None
        if isinstance(address, str) and address:
            found.append(address.lower())
    return found


def _header_text(headers: object) -> tuple[str, ...] | None:
    """The `header_forms` of the To and Cc headers; None when they cannot be read."""
    if not isinstance(headers, Mapping):
        return None
    parts: list[str] = []
    for name, value in headers.items():
        if not isinstance(name, str) or name.lower() not in ("to", "cc"):
            continue
        # One header is a string; a repeated one, a list of them.
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None
        parts.extend(values)
    return header_forms("\n".join(parts))


def _envelope_recipients(item: Mapping[str, Any]) -> tuple[str, ...]:
    envelope = item.get("envelope")
    if not isinstance(envelope, Mapping):
        return ()
    to = envelope.get("to")
    # A live message has [{address, args}]; one reloaded from disk has the
    # parsed To header, [{address, name}]; either way only `address` matters.
    if isinstance(to, Mapping):
        to = [to]
    if not isinstance(to, list):
        return ()
    found: list[str] = []
    for entry in to:
        address = entry.get("address") if isinstance(entry, Mapping) else entry
        if isinstance(address, str) and address and address.lower() not in found:
            found.append(address.lower())
    return tuple(found)


def _bad_shape(what: str) -> ProviderUnavailable:
    return ProviderUnavailable(
        f"MailDev answered with an unexpected shape: {what}", error_code="bad_response"
    )


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
