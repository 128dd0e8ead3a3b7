"""The SMTP sink: an aiosmtpd handler that calls the intake use cases.

``250`` means the raw bytes are stored in PostgreSQL: the messages of all
sessions that arrive while one store commits are stored in the next one
transaction (``app/smtp/batching.py``). The push to waiting signals (once per
stored batch) and the parsing happen after the answer (parsing in a worker
process), so neither a hostile message nor a slow broker delays the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from aiosmtpd.smtp import SMTP, Envelope, Session
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError

from app.domain.chaos import ChaosStage
from app.domain.mail import header_block
from app.domain.refusals import RefusalReason, too_large_detail
from app.infra.parse_pool import ParsePool
from app.infra.redis import AsyncRedis, async_client
from app.observability.logs import failure_extra
from app.settings import Settings
from app.smtp.batching import GroupCommit
from app.smtp.refusals import RefusalLog, reply_code
from app.usecases import intake
from app.usecases.chaos import VERSION_KEY, VERSION_TIMEOUT_SECONDS, SinkChaos, version_of

log = logging.getLogger("signalbox.smtp")

# Messages waiting to be parsed, each held in memory (up to the size limit).
# Past this, a new message is still stored, answered and pushed, but not
# parsed: it keeps its envelope recipients (a flood cannot exhaust memory).
MAX_PENDING_PARSES = 64

# A stored message this small is looked at for more recipients on the event
# loop itself: the look is a linear scan of its header block (no parse; at
# most 0.5 ms at this size in every hostile header shape measured), and most
# messages name only envelope recipients, so they need no task, no thread and
# no parse. A larger message is looked at in a thread.
INLINE_SCAN_BYTES = 16 * 1024

# Stored mail held in memory until it is recorded for the inbox.
MAX_RECORDING_BYTES = 64 * 1024 * 1024

# A batch's inbox record (a parse and an insert) waits for the batch's push
# (a waiting signal found) this long at most: on two cores the two competed
# for the interpreter, and the push is what a waiting test is timing.
RECORD_AFTER_PUSH_SECONDS = 0.25


def _header_recipients_failed(sink_id: int, exc: Exception) -> None:
    log.warning(
        "header recipients of a stored message could not be added",
        extra=failure_extra("sink_parse_failed", exc, sink_message_id=sink_id),
    )


def _one_message_may_cause(exc: Exception) -> bool:
    """Whether a failed store may be one message's fault (a value the database
    refuses), not the database's (unreachable, timed out)."""
    return not isinstance(exc, OperationalError | InterfaceError | SQLAlchemyTimeoutError)


_AIOSMTPD_NAMES: dict[type, list[str]] = {}


def aiosmtpd_names(cls: type) -> list[str]:
    """The attribute names aiosmtpd builds its tables from, for each
    connection, with dir() and inspect.getmembers() (which reads every
    attribute): commands (`smtp_*`), AUTH mechanisms (`auth_*`) and the
    handler's hooks (`handle_*`). A class whose `__dir__` answers these
    costs a connection a fraction of the CPU."""
    names = _AIOSMTPD_NAMES.get(cls)
    if names is None:
        names = [n for n in dir(cls) if n.startswith(("smtp_", "auth_", "handle_"))]
        _AIOSMTPD_NAMES[cls] = names
    return names


class SinkHandler:
    """Accepts mail for the configured domains (any, if none are set);
    refuses other recipients with 550, and recipients past
    `SIGNALBOX_SMTP_MAX_RECIPIENTS` with 452; answers a `RCPT TO` or `DATA`
    that a namespace's chaos rule covers with the rule's reply (and stores
    nothing for it). aiosmtpd itself answers 552 to
    mail over `SIGNALBOX_SMTP_MAX_BYTES`, and nothing of it is stored."""

    def __dir__(self) -> list[str]:
        return aiosmtpd_names(type(self))  # read by aiosmtpd for each connection

    def __init__(
        self,
        settings: Settings,
        parser: ParsePool | None = None,
        runner: intake.CheckRunner | None = None,
        chaos: SinkChaos | None = None,
    ) -> None:
        """`runner` makes a push's checks here (`app.usecases.checks.runner`);
        without it a push sends a check task. `chaos` holds the namespaces'
        chaos rules (none: the sink answers for itself only)."""
        self.settings = settings
        self.runner = runner
        self.chaos = chaos
        # Chaos reads its version from Redis on the event loop (a client made
        # there at first use); PostgreSQL is asked in a thread of its own.
        self._chaos_redis: AsyncRedis | None = None
        self._chaos_thread = ThreadPoolExecutor(2, thread_name_prefix="sink-chaos")
        self.domains = settings.accepted_domains
        self.parser = parser or ParsePool()
        # Stores have a thread of their own: a slow broker holding every push
        # thread must never delay the next message's 250.
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="sink-store")
        self._push_thread = ThreadPoolExecutor(1, thread_name_prefix="sink-push")
        self._after_threads = ThreadPoolExecutor(4, thread_name_prefix="sink-after")
        # Recording for the inbox: one batch at a time, in the stores' order.
        self._record_thread = ThreadPoolExecutor(1, thread_name_prefix="sink-record")
        self.recording_bytes = 0
        self.stores: GroupCommit[intake.Received, intake.StoredMail] = GroupCommit(
            partial(intake.store_many, settings),
            self._store_thread,
            size_of=lambda received: len(received[2]),
            max_bytes=max(settings.smtp_max_bytes, 8 * 1024 * 1024),
            on_stored=self._after_store,
            split_on=_one_message_may_cause,
        )
        # Pushes merge like stores: those waiting while one runs go in one.
        self.pushes: GroupCommit[intake.Stored, None] = GroupCommit(
            partial(intake.push_many, settings, runner=runner),
            self._push_thread,
            size_of=lambda _: 1,
            max_items=256,
        )
        # Pushes and parses in flight; kept referenced so none is
        # garbage-collected midway.
        self.pending: set[asyncio.Task[None]] = set()
        # Stored messages held in memory to be looked at for more recipients.
        self.parses_waiting = 0
        # Every refused delivery: counted, and recorded for dead letters.
        self.refusals = RefusalLog(settings)

    async def handle_MAIL(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        mail_options: list[str],
    ) -> str:
        """Accept the sender (as aiosmtpd does without this hook) and start
        bringing the chaos rules up to date meanwhile: the client's next
        command is its first RCPT TO, whose answer waits for them, so the
        round trip to Redis runs while that command is on its way instead of
        after it."""
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        if self.chaos is not None:
            refresh = asyncio.ensure_future(self._refresh_chaos(self.chaos))
            # A transaction given up before its RCPT TO never awaits it: its
            # error (if any) is not reported as never retrieved.
            refresh.add_done_callback(lambda done: done.cancelled() or done.exception())
            envelope.chaos_refresh = refresh  # type: ignore[attr-defined]
        return "250 OK"

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        if len(envelope.rcpt_tos) >= self.settings.smtp_max_recipients:
            return self._refused(
                "452 4.5.3 Too many recipients",
                RefusalReason.TOO_MANY_RECIPIENTS,
                session,
                [address],
            )
        domain = address.rpartition("@")[2].lower().rstrip(">")
        if not domain:
            return "553 5.1.3 Recipient address must be name@domain"
        if self.domains and domain not in self.domains:
            return self._refused(
                "550 5.7.1 Recipient domain not accepted here",
                RefusalReason.RECIPIENT_DOMAIN,
                session,
                [address],
                detail=f"recipient domain {domain} not accepted here",
            )
        refused = await self._chaos_reply(envelope, ChaosStage.RCPT, [address])
        if refused is None and self.chaos is not None and self.chaos.rules:
            # Another namespace's DATA rule acts here, for its own recipient,
            # once the transaction carries another tenant's recipient.
            refused = await asyncio.get_running_loop().run_in_executor(
                self._chaos_thread, self.chaos.data_reply_at_rcpt, address, list(envelope.rcpt_tos)
            )
        if refused is not None:
            return self._refused(refused, RefusalReason.CHAOS, session, [address])
        envelope.rcpt_tos.append(address)
        return "250 OK"

    def _refused(
        self,
        reply: str,
        reason: RefusalReason,
        session: Session,
        recipients: Sequence[str],
        detail: str | None = None,
    ) -> str:
        """Note a refused delivery (counted, recorded for dead letters); the reply."""
        if reply_code(reply) >= 400:
            auth = getattr(session, "auth_namespace", None)
            self.refusals.note(reply, reason, recipients, auth, detail)
        return reply

    async def _chaos_reply(
        self, envelope: Envelope, stage: ChaosStage, addresses: list[str]
    ) -> str | None:
        """The reply of a chaos rule for this command, or None. The rules are
        brought up to date once per mail transaction (from its MAIL FROM on);
        with none held, nothing more is asked of anyone."""
        chaos = self.chaos
        if chaos is None:
            return None
        loop = asyncio.get_running_loop()
        if not getattr(envelope, "chaos_refreshed", False):
            envelope.chaos_refreshed = True  # type: ignore[attr-defined]
            started = getattr(envelope, "chaos_refresh", None)  # by handle_MAIL
            await (started or self._refresh_chaos(chaos))
        if not chaos.rules:
            return None
        return await loop.run_in_executor(self._chaos_thread, chaos.reply_for, stage, addresses)

    async def _refresh_chaos(self, chaos: SinkChaos) -> None:
        """Bring the chaos rules up to date: their version read from Redis
        here, on the event loop; the rules re-read from PostgreSQL, in a
        thread, only when the copy is not that version's or is too old (with
        no rules changed, a transaction crosses no thread for them)."""
        version = await self._chaos_version(chaos)
        if not chaos.is_current(version):
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._chaos_thread, chaos.reload, version)

    async def _chaos_version(self, chaos: SinkChaos) -> bytes | None:
        """The rules' version in Redis; None without Redis or when it does
        not answer (the copy is then kept by its age)."""
        url = chaos.version_url
        if url is None:
            return None
        if self._chaos_redis is None:
            self._chaos_redis = async_client(url, timeout=VERSION_TIMEOUT_SECONDS)
        try:
            return version_of(await self._chaos_redis.get(VERSION_KEY))
        except Exception:
            return None

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        raw: Any = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        if len(raw) > self.settings.smtp_max_bytes:
            return self._refused(
                "552 5.3.4 Message too big",
                RefusalReason.MESSAGE_TOO_LARGE,
                session,
                envelope.rcpt_tos,
                detail=too_large_detail(len(raw), self.settings.smtp_max_bytes),
            )
        refused = await self._chaos_reply(envelope, ChaosStage.DATA, list(envelope.rcpt_tos))
        if refused is not None:  # nothing stored
            return self._refused(refused, RefusalReason.CHAOS, session, envelope.rcpt_tos)
        rcpts = list(envelope.rcpt_tos)
        if self.chaos is not None and self.chaos.rules:
            # A mixed transaction: a DATA rule keeps the mail from its own
            # namespace's recipients only; the others get it.
            dropped = await asyncio.get_running_loop().run_in_executor(
                self._chaos_thread, self.chaos.data_own_recipients, rcpts
            )
            rcpts = [r for r in rcpts if r not in dropped]
        data = bytes(raw)
        auth = getattr(session, "auth_namespace", None)
        try:
            stored = await self.stores.submit(
                intake.Received(envelope.mail_from, rcpts, data, auth)
            )
        except Exception:
            log.exception("message could not be stored", extra={"event": "sink_store_failed"})
            return "451 4.3.0 Temporary failure storing the message; try again"
        return f"250 OK queued as {stored.sink_id} {stored.message_id}"

    def _after_store(
        self, received: Sequence[intake.Received], stored: Sequence[intake.StoredMail]
    ) -> None:
        """Once a batch is committed (its 250s are due): push its recipients'
        signals, and look at each message for more recipients (one of at most
        INLINE_SCAN_BYTES here). At most MAX_PENDING_PARSES messages are held
        in memory for that; past it a message keeps its envelope recipients
        (a flood with a slow broker or slow parses cannot exhaust memory)."""
        sink_ids = [s.sink_id for s in stored]
        envelope = [r for _, rcpts, *_ in received for r in rcpts]
        push = asyncio.get_running_loop().create_task(self._push(sink_ids, envelope))
        self._hold(push)
        self._track(self._record(stored, received, after=push))
        for sink_id, (_, rcpts, raw, *_) in zip(sink_ids, received, strict=True):
            scanned = len(raw) <= INLINE_SCAN_BYTES
            if scanned and not intake.needs_parse(raw, rcpts):
                continue  # its To and Cc plainly name only envelope recipients
            if self.parses_waiting >= MAX_PENDING_PARSES:
                # Not held for a parse, but its To and Cc are not dropped:
                # its header block alone (64 KiB at most) is read for them.
                log.warning(
                    "too many messages waiting to be parsed; "
                    "this one's To and Cc are read from its header block",
                    extra={"event": "sink_parse_headers_only", "sink_message_id": sink_id},
                )
                self._track(self._header_recipients(sink_id, rcpts, header_block(raw)))
                continue
            self.parses_waiting += 1
            self._track(self._parse_one(sink_id, rcpts, raw, scanned=scanned))

    async def _record(
        self,
        stored: Sequence[intake.StoredMail],
        received: Sequence[intake.Received],
        *,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        """Record the stored batch for the inbox (parsed in the parse pool, off
        the SMTP path), once its push (`after`) is done or has had
        RECORD_AFTER_PUSH_SECONDS. At most MAX_RECORDING_BYTES of mail wait
        for it; past that a message is recorded by the first look that sees
        it instead."""
        size = sum(len(r[2]) for r in received)
        if self.recording_bytes + size > MAX_RECORDING_BYTES and self.recording_bytes:
            log.warning(
                "too much mail waiting to be recorded; a look records this batch",
                extra={
                    "event": "sink_record_skipped",
                    "message_ids": [s.message_id for s in stored],
                },
            )
            return
        self.recording_bytes += size
        try:
            if after is not None:
                await asyncio.wait((after,), timeout=RECORD_AFTER_PUSH_SECONDS)
            await asyncio.get_running_loop().run_in_executor(
                self._record_thread,
                intake.record_stored,
                self.settings,
                stored,
                received,
                self.parser.parse_blocking,  # parsed as the sink's checks parse
            )
        except Exception as exc:  # stored and answered; a look records them
            log.warning(
                "stored messages could not be recorded for the inbox",
                extra={"event": "sink_record_failed", "error": type(exc).__name__},
            )
        finally:
            self.recording_bytes -= size

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        self._hold(asyncio.get_running_loop().create_task(work))

    def _hold(self, task: asyncio.Task[None]) -> None:
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def _push(self, sink_ids: Sequence[int], envelope: Sequence[str]) -> None:
        try:
            await self.pushes.submit((sink_ids, envelope))
        except Exception as exc:  # the messages are stored; their next check finds them
            log.warning(
                "stored messages could not be pushed",
                extra={"event": "sink_push_failed", "error": type(exc).__name__},
            )

    async def _add_recipients(
        self, add: Callable[..., object], sink_id: int, rcpts: Sequence[str], found: object
    ) -> None:
        """Run an intake step that adds the recipients `found` in a stored
        message (its header block, or its parse) on the after-answer threads."""
        await asyncio.get_running_loop().run_in_executor(
            self._after_threads,
            partial(add, runner=self.runner),
            self.settings,
            sink_id,
            rcpts,
            found,
        )

    async def _header_recipients(self, sink_id: int, rcpts: Sequence[str], head: bytes) -> None:
        """Add the To and Cc recipients a header block names (and push theirs)."""
        try:
            await self._add_recipients(intake.add_header_block_recipients, sink_id, rcpts, head)
        except Exception as exc:  # the message is stored; its envelope recipients stand
            _header_recipients_failed(sink_id, exc)

    async def _parse_one(
        self, sink_id: int, rcpts: Sequence[str], raw: bytes, *, scanned: bool = False
    ) -> None:
        """Parse one stored message, unless its To/Cc plainly name only envelope
        recipients (`scanned`: that was looked at already), and add its other
        To/Cc recipients (and push theirs). Counted in ``parses_waiting``
        until done."""
        loop = asyncio.get_running_loop()
        try:
            if not scanned and not await loop.run_in_executor(
                self._after_threads, intake.needs_parse, raw, rcpts
            ):
                return
            mail = await self.parser.parse(raw)
            if mail is None:
                return
            await self._add_recipients(intake.add_header_recipients, sink_id, rcpts, mail)
        except Exception as exc:  # the message is stored; its envelope recipients stand
            _header_recipients_failed(sink_id, exc)
        finally:
            self.parses_waiting -= 1

    def warm(self) -> None:
        """Connect to the database and the broker on the push thread (the
        first push would otherwise pay for it), without waiting for it."""
        self._push_thread.submit(intake.warm, self.settings)

    async def aclose(self) -> None:
        """Close what lives on the event loop: the chaos version's client."""
        client, self._chaos_redis = self._chaos_redis, None
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        self.parser.close(wait_if_idle=True)
        self._after_threads.shutdown(wait=False, cancel_futures=True)
        self._chaos_thread.shutdown(wait=False, cancel_futures=True)
        self._store_thread.shutdown(wait=False)
        self._push_thread.shutdown(wait=False, cancel_futures=True)
        self._record_thread.shutdown(wait=False, cancel_futures=True)
        self.refusals.close()
