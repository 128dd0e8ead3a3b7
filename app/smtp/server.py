"""Run the SMTP sink (aiosmtpd) on SIGNALBOX_SMTP_HOST:SIGNALBOX_SMTP_PORT."""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from typing import Any, cast

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import MISSING, SMTP, syntax

from app.domain.mail import PLAIN_ADDR_SPEC
from app.domain.refusals import RefusalReason, too_large_detail
from app.infra.joined_writes import JoinedWrites
from app.settings import Settings
from app.smtp.data import TOO_LONG, TOO_MUCH, read_data
from app.smtp.handler import SinkHandler, aiosmtpd_names
from app.smtp.session import SinkSMTP
from app.smtp.tls import server_context, sink_hostname, tls_wanted

log = logging.getLogger("signalbox.smtp")


class _ConnectionGate:
    """Counts open SMTP sessions, in all and per client address; all of them
    run on the sink's one event loop."""

    def __init__(self, limit: int, per_address: int | None = None) -> None:
        self.limit = limit
        self.per_address = limit if per_address is None else per_address
        self.open = 0
        # Only addresses with a session open: the map never outgrows `limit`.
        self.by_address: dict[str, int] = {}

    def enter(self, address: str) -> str | None:
        """Take a place for a session from `address`: None, or why there is none."""
        if self.open >= self.limit:
            return "too many open SMTP sessions"
        if self.by_address.get(address, 0) >= self.per_address:
            return "too many open SMTP sessions from one address"
        self.open += 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        return None

    def leave(self, address: str) -> None:
        self.open -= 1
        left = self.by_address[address] - 1
        if left:
            self.by_address[address] = left
        else:
            del self.by_address[address]


# Before its first command a client is given at most this long (or the idle
# limit, if shorter): a connection that never speaks is the cheap way to
# hold one of the sink's places.
FIRST_COMMAND_SECONDS = 10.0
# After its 421 an idle client that reads nothing (its reply cannot be
# flushed) is cut off this long after, so its place is freed.
CLOSE_GRACE_SECONDS = 5.0
IDLE_REPLY = b"421 4.4.2 Idle too long; closing connection\r\n"


# `<local@domain>` of a plain address, then the parameters (MAIL FROM:<a@b> SIZE=10).
_PLAIN_PATH_RE = re.compile(rf"<({PLAIN_ADDR_SPEC})>")


class _CappedSMTP(SinkSMTP):
    """An SMTP session that answers 421 and closes when the sink already has
    `SIGNALBOX_SMTP_MAX_CONNECTIONS` sessions open, or
    `SIGNALBOX_SMTP_MAX_CONNECTIONS_PER_IP` from the client's address; and
    when the client sends no command for `timeout` seconds
    (`SIGNALBOX_SMTP_IDLE_SECONDS`; before the first command,
    `min(FIRST_COMMAND_SECONDS, timeout)`). Time the sink spends on a command
    is not the client's idleness, nor is a message whose bytes keep arriving."""

    def __init__(self, handler: Any, *, gate: _ConnectionGate, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._gate = gate
        self._first_command_seconds = min(FIRST_COMMAND_SECONDS, self._timeout_duration)
        self._address = ""
        self._in_data = False
        self._heard_at = 0.0  # loop time of the last bytes read in DATA
        self._hooks_running = 0

    def __dir__(self) -> list[str]:
        # aiosmtpd builds its command and AUTH tables for each connection from
        # dir(self) and inspect.getmembers(self), which reads every attribute
        # (with the host name lookup, 485 µs of CPU per connection; 86 µs
        # without): only the names it looks for are listed, once per class.
        return aiosmtpd_names(type(self))

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        """aiosmtpd's reading of a MAIL FROM / RCPT TO path, without its RFC 5322
        parser (a fifth of the sink's CPU, and a class defined per call) when
        the path is a plain `<address>`: that parser reads such a path as
        written and drops the whitespace after it. Anything else goes to it."""
        plain = _PLAIN_PATH_RE.match(arg)
        if plain is not None:
            rest = arg[plain.end() :].lstrip(" \t")
            if not rest.startswith("("):  # a comment: the parser's to read
                address = plain.group(1)
                local_part = address.rpartition("@")[0]
                if self.local_part_limit and len(local_part) > self.local_part_limit:
                    return None, None
                return address, rest
        return super()._getaddr(arg)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A multi-line reply (EHLO's) goes out in one write, not one per line.
        joined = JoinedWrites(cast(asyncio.Transport, transport), self.loop)
        super().connection_made(cast(asyncio.BaseTransport, joined))  # arms aiosmtpd's timer
        self._reset_timeout(self._first_command_seconds)

    def data_received(self, data: bytes) -> None:
        if self._in_data:
            # Read by the timer when it fires: no timer re-armed per chunk.
            self._heard_at = self.loop.time()
        super().data_received(data)

    async def _call_handler_hook(self, command: str, *args: Any) -> Any:
        self._hooks_running += 1
        try:
            return await super()._call_handler_hook(command, *args)
        finally:
            self._hooks_running -= 1
            # The client waited on the sink: its idle time starts again now.
            self._rearm()

    @syntax("DATA")
    async def smtp_DATA(self, arg: str) -> None:
        self._in_data = True
        self._heard_at = self.loop.time()  # the DATA command itself
        try:
            await self._data(arg)
        finally:
            self._in_data = False
        self._rearm()

    async def _data(self, arg: str) -> None:
        """aiosmtpd's DATA command, but with lines read by `app.smtp.data`
        (a bare LF ends a line; the bytes are kept as received)."""
        if await self.check_helo_needed() or await self.check_auth_needed("DATA"):
            return
        assert self.envelope is not None
        if not self.envelope.rcpt_tos:
            await self.push("503 Error: need RCPT command")
            return
        if arg:
            await self.push("501 Syntax: DATA")
            return
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        read = await read_data(self._reader, self.data_size_limit, self.line_length_limit)
        if read.content is None:
            reply = read.reply or TOO_LONG
            if reply == TOO_MUCH:
                limit = self.data_size_limit or 0
                detail = too_large_detail(read.size, limit)
                self._note(reply, RefusalReason.MESSAGE_TOO_LARGE, self.envelope.rcpt_tos, detail)
            else:
                self._note(reply, RefusalReason.LINE_TOO_LONG, self.envelope.rcpt_tos)
            self._set_post_data_state()
            await self.push(reply)
            return
        self.envelope.content = read.content
        self.envelope.original_content = read.content
        status = await self._call_handler_hook("DATA")
        self._set_post_data_state()
        await self.push("250 OK" if status is MISSING else status)

    def _rearm(self, duration: float | None = None) -> None:
        if self.transport is not None:  # else connection_lost has cancelled the timer
            self._reset_timeout(duration)

    def _timeout_cb(self) -> None:
        if self.transport is None:
            return
        transport = cast(asyncio.Transport, self.transport)
        if transport.is_closing():
            # Closed (a 421, QUIT) yet still connected: the client reads
            # nothing, and the reply waiting for it would keep its place.
            transport.abort()
            return
        if self._hooks_running:
            # The sink is storing or checking the client's command, which
            # never dies of the client's timer (a message half stored).
            self._rearm()
            return
        if self._in_data:
            quiet = self.loop.time() - self._heard_at
            if quiet < self._timeout_duration:
                self._rearm(self._timeout_duration - quiet)
                return
        log.info("idle SMTP session closed", extra={"event": "smtp_idle_closed"})
        transport.write(IDLE_REPLY)
        transport.close()  # once the reply is sent
        # If it cannot be sent (the client reads nothing), the timer fires
        # once more and aborts; connection_lost cancels it otherwise.
        self._rearm(CLOSE_GRACE_SECONDS)

    async def _handle_client(self) -> None:
        assert self.session is not None
        peer = self.session.peer
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else str(peer or "")
        refused = self._gate.enter(self._address)
        if refused is not None:
            log.warning(
                "connection refused: %s",
                refused,
                extra={"event": "smtp_connection_refused", "count": self._gate.open},
            )
            await self.push("421 4.7.0 Too many connections, try again later")
            if self.transport is not None:
                self.transport.close()
            return
        try:
            await super()._handle_client()
        finally:
            self._gate.leave(self._address)


class SinkController(Controller):
    """The plain listener (STARTTLS unless `SIGNALBOX_SMTP_TLS=off`) and, on
    `SIGNALBOX_SMTPS_PORT` (0: none), the implicit-TLS one: one event loop,
    one handler, one connection gate for both. With `reuse_port` both are
    bound with SO_REUSEPORT: one of `SIGNALBOX_SMTP_PROCESSES` sink processes,
    among which the kernel spreads the connections."""

    def __init__(
        self,
        handler: SinkHandler,
        settings: Settings,
        *,
        tls_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, **kwargs)
        self.sink = handler
        self.settings = settings
        self.tls = tls_context
        self.reuse_port = reuse_port
        self.smtps_port = settings.smtps_port if tls_context is not None else 0
        self.smtps_server: asyncio.AbstractServer | None = None
        self.gate = _ConnectionGate(
            settings.smtp_max_connections, settings.smtp_max_connections_per_ip
        )

    def factory(self) -> SMTP:
        starttls = self.tls if self.settings.smtp_tls != "off" else None
        return _CappedSMTP(
            self.handler,
            gate=self.gate,
            settings=self.settings,
            tls_context=starttls,
            **self.SMTP_kwargs,
        )

    def _smtps_factory(self) -> SMTP:
        return _CappedSMTP(
            self.handler,
            gate=self.gate,
            settings=self.settings,
            implicit_tls=True,
            **self.SMTP_kwargs,
        )

    def _create_server(self) -> Any:
        return self._create_servers()

    async def _create_servers(self) -> asyncio.AbstractServer:
        # Only when asked: a lone sink bound with SO_REUSEPORT would let a
        # second one (another stack on the same port) share its connections.
        reuse = self.reuse_port or None
        plain = await self.loop.create_server(
            self._factory_invoker, host=self.hostname, port=self.port, reuse_port=reuse
        )
        if self.smtps_port:
            try:
                self.smtps_server = await self.loop.create_server(
                    self._smtps_factory,
                    host=self.hostname,
                    port=self.smtps_port,
                    ssl=self.tls,
                    reuse_port=reuse,
                )
            except BaseException:
                plain.close()
                raise
        return plain

    def cancel_tasks(self, stop_loop: bool = True) -> None:
        if self.smtps_server is not None:
            self.smtps_server.close()
        super().cancel_tasks(stop_loop)

    def start(self) -> None:
        super().start()
        # Start the parse processes, and connect to the database and the
        # broker, now, not with the first message.
        self._warming = asyncio.run_coroutine_threadsafe(self.sink.parser.warm(), self.loop)
        self.sink.warm()

    def stop(self, no_assert: bool = False) -> None:
        if self.loop.is_running():
            # The chaos version's Redis client lives on the loop: closed there.
            closing = asyncio.run_coroutine_threadsafe(self.sink.aclose(), self.loop)
            try:
                closing.result(timeout=2)
            except Exception as exc:  # the process is on its way out
                log.warning(
                    "the sink's Redis client could not be closed",
                    extra={"event": "smtp_close_failed", "error": type(exc).__name__},
                )
        super().stop(no_assert=no_assert)
        self.sink.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The sink's event loop: uvloop's where it is installed (it is a
    dependency off Windows), else asyncio's. With it the sink spent a fifth
    less CPU per message at 8 ingest connections (bench/PROFILE.md §10)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def make_controller(settings: Settings, *, reuse_port: bool = False) -> SinkController:
    """One sink process's controller; `reuse_port` when it is one of several
    on the same ports (`app.cli.sink_processes`)."""
    from app.infra.parse_pool import ParsePool
    from app.usecases.chaos import SinkChaos
    from app.usecases.checks import process_runner

    # A push's check is made here, not queued behind a slow provider's calls.
    # Its matching parses in the sink's parse pool (a small message in the
    # check's thread, bounded to milliseconds): no message stalls the sink.
    parser = ParsePool()
    runner = process_runner(settings, parse=parser.parse_blocking)
    handler = SinkHandler(settings, parser=parser, runner=runner, chaos=SinkChaos(settings))
    # Made (or read) before the loop starts: a certificate that cannot be
    # used fails the start naming its setting.
    tls = server_context(settings) if tls_wanted(settings) else None
    return SinkController(
        handler,
        settings,
        tls_context=tls,
        reuse_port=reuse_port,
        hostname=settings.smtp_host,
        port=settings.smtp_port,
        # The name in the banner, EHLO and the self-signed certificate:
        # aiosmtpd looks it up for each connection when it is not given.
        server_hostname=sink_hostname(settings),
        data_size_limit=settings.smtp_max_bytes,
        # Idle between commands; before the first, shorter (_CappedSMTP).
        timeout=settings.smtp_idle_seconds,
        # Mail bytes exactly as sent: parsing is ours and never crashes.
        decode_data=False,
        ident="Signalbox sink",
        loop=new_event_loop(),
    )
