"""IMAP provider: reads one folder of an IMAP4rev1 mailbox, UID-based.

Message ids are ``"{UIDVALIDITY}:{UID}"``: stable across checks and across
reconnections, and they change (as they must) if the server rebuilds the
folder. The folder is opened read-only (EXAMINE) and bodies are fetched with
``BODY.PEEK[]``, so a check never marks a message as seen or changes it.

A look SEARCHes for the messages to its recipients (``TO`` or ``CC``, each
``SINCE`` the day before its span opens: SEARCH dates are day-granular),
FETCHes their INTERNALDATE, and the bodies only of those inside the look's
span: mail to other recipients is never downloaded. A recipient that cannot
be sent as a quoted string (`app.providers.narrowing.searchable`) makes that
look a plain ``SINCE`` search, as a query without recipients does.

Errors are mapped to the provider protocol's two kinds:

==============================================  ===================  ====================
what happened                                   raised               ``error_code``
==============================================  ===================  ====================
socket timeout                                  ProviderUnavailable  ``timeout``
connection refused                              ProviderUnavailable  ``connection_refused``
connection dropped, BYE, other network errors   ProviderUnavailable  ``imap_unavailable``
unparsable or non-compliant server answers      ProviderUnavailable  ``bad_response``
LOGIN refused                                   ProviderRejected     ``auth_failed``
the folder does not exist                       ProviderRejected     ``folder_not_found``
the server's TLS certificate is not trusted     ProviderRejected     ``tls_verify_failed``
==============================================  ===================  ====================

Nothing here logs a message's content or the password.
"""

from __future__ import annotations

import contextlib
import imaplib
import logging
import re
import ssl
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone

from app.errors import ProviderError, ProviderRejected, ProviderUnavailable
from app.providers.base import WHOLE_SECONDS, ProviderMessage, SearchQuery
from app.providers.narrowing import Narrowing, narrowing

log = logging.getLogger(__name__)

# IMAP dates use English month names whatever the locale (RFC 3501 date-month).
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MONTH_NUMBER = {name.lower(): index + 1 for index, name in enumerate(_MONTHS)}

_UID_RE = re.compile(rb"\bUID (\d+)")
_INTERNALDATE_RE = re.compile(
    rb'INTERNALDATE "([ \d]?\d)-([A-Za-z]{3})-(\d{4}) (\d\d):(\d\d):(\d\d) ([+-])(\d\d)(\d\d)"'
)
# The start of an untagged FETCH line ("12 (UID ..."), as imaplib hands it over
# without the "* ". Anything else between records is the tail of the previous one.
_FETCH_START_RE = re.compile(rb"^\d+ \(")

# Keep UID FETCH and SEARCH command lines well below common server line
# limits (8 KiB+): 200 UIDs, or 25 recipients (each up to 254 characters, twice).
_FETCH_BATCH = 200
_SEARCH_RECIPIENTS = 25

# imaplib raises `abort` both for dropped connections and for answers it cannot
# parse; only its wording tells them apart.
_GARBAGE_MARKERS = ("unexpected response", "unexpected tagged response", "unterminated line")


class _BadResponse(Exception):
    """The server answered something this module cannot make sense of."""


class ImapProvider:
    """Reads messages from one IMAP folder.

    One connection is kept open and reused across `search` calls; it is
    dropped on any failure and opened again on the next call. A reused
    connection that turns out to be dead (the server closed it while idle)
    is retried once on a fresh connection within the same call, so an idle
    timeout on the server never surfaces as a provider error.

    Instances are safe to share between threads (calls are serialised).
    """

    type = "imap"
    # INTERNALDATE has a resolution of one second.
    timestamp_precision = WHOLE_SECONDS
    pushes = False

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        tls: bool,
        username: str,
        password: str,
        folder: str = "INBOX",
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.tls = tls
        self.username = username
        self._password = password
        self.folder = folder
        self.timeout = timeout
        # Tests and private CAs may pass their own context; the default verifies
        # the certificate and the host name.
        self._ssl_context = ssl_context
        self._conn: imaplib.IMAP4 | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        # Spelled out so that the password can never end up in a log line.
        return (
            f"ImapProvider(name={self.name!r}, host={self.host!r}, port={self.port}, "
            f"tls={self.tls}, username={self.username!r}, folder={self.folder!r})"
        )

    # -- the Provider protocol -------------------------------------------------

    def search(self, query: SearchQuery) -> Sequence[ProviderMessage]:
        """Messages to `query.recipients` (all, for a query without them) whose
        INTERNALDATE is at or after `query.since`, oldest first.

        INTERNALDATE has a resolution of one second, so `since` is compared
        truncated to the second: a message delivered in the same second as
        `since` is returned.
        """
        plan = narrowing(query.since, query.recipients, query.windows, self.timestamp_precision)
        with self._lock:
            reused = self._conn is not None
            try:
                return self._search(plan)
            except ProviderUnavailable as exc:
                self._drop()
                if not (reused and exc.error_code == "imap_unavailable"):
                    raise
                log.info(
                    "imap provider %s: reused connection failed (%s), reconnecting once",
                    self.name,
                    exc.error_code,
                )
            except ProviderError:
                self._drop()
                raise
            try:
                return self._search(plan)
            except ProviderError:
                self._drop()
                raise

    def close(self) -> None:
        """Log out and close the connection; the next `search` reconnects."""
        with self._lock:
            self._drop(logout=True)

    # -- internals -------------------------------------------------------------

    def _search(self, plan: Narrowing) -> list[ProviderMessage]:
        try:
            return self._search_unmapped(plan)
        except ProviderError:
            raise
        except Exception as exc:
            mapped = _map_error(exc, f"{self.host}:{self.port}")
            if mapped is None:
                raise
            # `from None` for answers we could not parse: imaplib quotes the
            # offending line, which may be message content, and must not be logged.
            if mapped.error_code == "bad_response":
                raise mapped from None
            raise mapped from exc

    def _search_unmapped(self, plan: Narrowing) -> list[ProviderMessage]:
        conn = self._connection()
        uidvalidity = self._examine(conn)
        candidates: set[int] = set()
        for criteria in search_criteria(plan):
            typ, data = conn.uid("SEARCH", *criteria)
            if typ != "OK":
                raise _BadResponse("UID SEARCH was not OK")
            candidates.update(_parse_search(data))
        if not candidates:
            return []
        cutoff = plan.since
        # Dates first, bodies only for the messages inside the window: the
        # day-granular SEARCH can return a day's worth of older mail.
        dates = self._fetch(conn, sorted(candidates), "(UID INTERNALDATE)")
        wanted = sorted(uid for uid, (date, _) in dates.items() if date >= cutoff)
        if not wanted:
            return []
        bodies = self._fetch(conn, wanted, "(UID INTERNALDATE BODY.PEEK[])")
        messages = [
            ProviderMessage(
                provider_message_id=f"{uidvalidity}:{uid}",
                received_at=date,
                raw=body,
            )
            for uid, (date, body) in bodies.items()
            # A message expunged between the two fetches has no body: skip it.
            if body is not None and date >= cutoff
        ]
        messages.sort(key=lambda m: (m.received_at, _uid_of(m)))
        return messages

    def _connection(self) -> imaplib.IMAP4:
        if self._conn is not None:
            return self._conn
        conn: imaplib.IMAP4
        if self.tls:
            context = self._ssl_context or ssl.create_default_context()
            conn = imaplib.IMAP4_SSL(
                self.host, self.port, ssl_context=context, timeout=self.timeout
            )
        else:
            conn = imaplib.IMAP4(self.host, self.port, timeout=self.timeout)
        try:
            conn.login(self.username, self._password)
        except imaplib.IMAP4.abort:
            _shutdown(conn)
            raise
        except imaplib.IMAP4.error as exc:
            _shutdown(conn)
            # [UNAVAILABLE] is the server saying its auth backend is down (RFC 5530).
            if "UNAVAILABLE" in str(exc).upper():
                raise ProviderUnavailable(
                    f"IMAP server {self.host}:{self.port} could not authenticate right now",
                    error_code="imap_unavailable",
                ) from None
            raise ProviderRejected(
                f"IMAP login refused for user {self.username!r} at {self.host}:{self.port}",
                error_code="auth_failed",
            ) from None
        except BaseException:
            _shutdown(conn)
            raise
        log.debug("imap provider %s: connected to %s:%s", self.name, self.host, self.port)
        self._conn = conn
        return conn

    def _examine(self, conn: imaplib.IMAP4) -> int:
        """Open the folder read-only (again, to see new mail) and return UIDVALIDITY."""
        typ, data = conn.select(_quote_mailbox(self.folder), readonly=True)
        if typ != "OK":
            text = _first_text(data).upper()
            if "NONEXISTENT" in text or "DOESN'T EXIST" in text or "NOT EXIST" in text:
                raise ProviderRejected(
                    f"IMAP folder {self.folder!r} does not exist for {self.username!r}",
                    error_code="folder_not_found",
                )
            raise ProviderUnavailable(
                f"IMAP server refused to open folder {self.folder!r}",
                error_code="imap_unavailable",
            )
        _, values = conn.response("UIDVALIDITY")
        raw = values[-1] if values else None
        if not isinstance(raw, bytes) or not raw.strip().isdigit():
            raise _BadResponse("no UIDVALIDITY in the EXAMINE answer")
        return int(raw)

    def _fetch(
        self, conn: imaplib.IMAP4, uids: Sequence[int], items: str
    ) -> dict[int, tuple[datetime, bytes | None]]:
        found: dict[int, tuple[datetime, bytes | None]] = {}
        for start in range(0, len(uids), _FETCH_BATCH):
            batch = uids[start : start + _FETCH_BATCH]
            typ, data = conn.uid("FETCH", ",".join(str(uid) for uid in batch), items)
            if typ != "OK":
                raise _BadResponse("UID FETCH was not OK")
            wanted = set(batch)
            for uid, date, body in _parse_fetch(data):
                # Unsolicited FETCH lines (flag updates) can name other messages.
                if uid not in wanted:
                    continue
                previous = found.get(uid)
                if previous is None or previous[1] is None:
                    found[uid] = (date, body)
        return found

    def _drop(self, logout: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if logout:
            with contextlib.suppress(imaplib.IMAP4.error, OSError):
                conn.logout()
        _shutdown(conn)


def search_criteria(plan: Narrowing) -> list[list[str]]:
    """The UID SEARCH commands' arguments of a look: one per group of
    recipients, each ``TO`` or ``CC`` the recipient ``SINCE`` the day before its
    span opens (SINCE compares dates only, in the server's idea of the day:
    a day earlier is a safe superset, narrowed after on the exact INTERNALDATE).
    Without recipients, or with one that cannot be quoted: one plain SINCE."""
    if not plan.narrowed or not all(span.searchable for span in plan.spans):
        return [["SINCE", _day_before(plan.since)]]
    commands: list[list[str]] = []
    for start in range(0, len(plan.spans), _SEARCH_RECIPIENTS):
        group = plan.spans[start : start + _SEARCH_RECIPIENTS]
        keys = [
            f'(SINCE {_day_before(span.start)} OR TO "{span.recipient}" CC "{span.recipient}")'
            for span in group
        ]
        # Prefix OR: "OR OR a b c" is (a or b) or c.
        commands.append(["OR"] * (len(keys) - 1) + keys)
    return commands


def _map_error(exc: BaseException, where: str) -> ProviderError | None:
    """Turn a socket or imaplib failure into the provider protocol's error (None: not ours)."""
    if isinstance(exc, _BadResponse):
        return ProviderUnavailable(
            f"IMAP server {where} gave an answer that could not be parsed",
            error_code="bad_response",
        )
    if isinstance(exc, TimeoutError):
        return ProviderUnavailable(f"IMAP server {where} timed out", error_code="timeout")
    if isinstance(exc, ConnectionRefusedError):
        return ProviderUnavailable(
            f"IMAP server {where} refused the connection", error_code="connection_refused"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return ProviderRejected(
            f"IMAP server {where} has an untrusted TLS certificate",
            error_code="tls_verify_failed",
        )
    if isinstance(exc, imaplib.IMAP4.abort):
        if any(marker in str(exc) for marker in _GARBAGE_MARKERS):
            return ProviderUnavailable(
                f"IMAP server {where} gave an answer that could not be parsed",
                error_code="bad_response",
            )
        return ProviderUnavailable(
            f"IMAP server {where} closed the connection", error_code="imap_unavailable"
        )
    if isinstance(exc, imaplib.IMAP4.error):
        # Not IMAP4 compliant, BAD to a well-formed command, and the like.
        return ProviderUnavailable(
            f"IMAP server {where} gave an unexpected answer", error_code="bad_response"
        )
    if isinstance(exc, OSError):
        return ProviderUnavailable(
            f"IMAP server {where} is unreachable ({type(exc).__name__})",
            error_code="imap_unavailable",
        )
    if isinstance(exc, ValueError | UnicodeError):
        return ProviderUnavailable(
            f"IMAP server {where} gave an answer that could not be parsed",
            error_code="bad_response",
        )
    return None


def _as_utc(moment: datetime) -> datetime:
    # A naive `since` is taken as UTC, the server-wide convention.
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _day_before(moment: datetime) -> str:
    try:
        return _imap_date(moment - timedelta(days=1))
    except OverflowError:  # a window open since the year 1
        return _imap_date(moment)


def _imap_date(moment: datetime) -> str:
    return f"{moment.day}-{_MONTHS[moment.month - 1]}-{moment.year:04d}"


def _quote_mailbox(folder: str) -> str:
    # imaplib sends arguments verbatim; a folder with a space must be quoted.
    if folder and re.fullmatch(r"[A-Za-z0-9_./&-]+", folder):
        return folder
    escaped = folder.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _first_text(data: Sequence[object]) -> str:
    for item in data:
        if isinstance(item, bytes):
            return item.decode("utf-8", "replace")
    return ""


def _parse_search(data: Sequence[object]) -> list[int]:
    uids: list[int] = []
    for item in data:
        if item is None:
            continue
        if not isinstance(item, bytes):
            raise _BadResponse("UID SEARCH answer is not a list of numbers")
        for token in item.split():
            if not token.isdigit():
                raise _BadResponse("UID SEARCH answer is not a list of numbers")
            uids.append(int(token))
    return sorted(set(uids))


def _parse_fetch(data: Sequence[object]) -> Iterator[tuple[int, datetime, bytes | None]]:
    """Yield (uid, internaldate, body or None) for each FETCH line imaplib returned.

    imaplib gives a line with a literal as ``(head, literal)`` followed by the
    rest of the line as bytes (``b")"`` or more items); the items may come in
    any order, so UID and INTERNALDATE are looked for in head and tail alike.
    """
    records: list[tuple[bytearray, bytes | None]] = []
    open_record = False
    for item in data:
        if item is None:
            continue
        if isinstance(item, tuple):
            if len(item) != 2 or not all(isinstance(part, bytes) for part in item):
                raise _BadResponse("FETCH answer has an unexpected shape")
            records.append((bytearray(item[0]), item[1]))
            open_record = True
        elif isinstance(item, bytes):
            if open_record and not _FETCH_START_RE.match(item):
                records[-1][0].extend(item)
            else:
                records.append((bytearray(item), None))
                open_record = False
        else:
            raise _BadResponse("FETCH answer has an unexpected shape")
    for meta, body in records:
        uid_match = _UID_RE.search(meta)
        if uid_match is None:
            continue
        date_match = _INTERNALDATE_RE.search(meta)
        if date_match is None:
            # A body without its date would be unplaceable in the window.
            if body is not None:
                raise _BadResponse("FETCH answer lacks INTERNALDATE")
            continue
        yield int(uid_match.group(1)), _parse_internaldate(date_match), body


def _parse_internaldate(match: re.Match[bytes]) -> datetime:
    day, month, year, hour, minute, second, sign, off_h, off_m = (
        group.decode("ascii") for group in match.groups()
    )
    month_number = _MONTH_NUMBER.get(month.lower())
    if month_number is None:
        raise _BadResponse("INTERNALDATE has an unknown month")
    offset = timedelta(hours=int(off_h), minutes=int(off_m))
    if sign == "-":
        offset = -offset
    local = datetime(
        int(year),
        month_number,
        int(day.strip()),
        int(hour),
        int(minute),
        int(second),
        tzinfo=timezone(offset),
    )
    return local.astimezone(UTC)


def _uid_of(message: ProviderMessage) -> int:
    return int(message.provider_message_id.rsplit(":", 1)[1])


def _shutdown(conn: imaplib.IMAP4) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown()
