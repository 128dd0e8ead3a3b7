"""Run the SMTP sink (aiosmtpd) on SIGNALBOX_SMTP_HOST:SIGNALBOX_SMTP_PORT."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP

from app.domain.mail import PLAIN_ADDR_SPEC
from app.settings import Settings
from app.smtp.handler import SinkHandler

log = logging.getLogger("signalbox.smtp")


class _ConnectionGate:
    """Counts open SMTP sessions; all of them run on the sink's one event loop."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0


# `<local@domain>` of a plain address, then the parameters (MAIL FROM:<a@b> SIZE=10).
_PLAIN_PATH_RE = re.compile(rf"<({PLAIN_ADDR_SPEC})>")


class _CappedSMTP(SMTP):
    """An SMTP session that answers 421 and closes when the sink already has
    `SIGNALBOX_SMTP_MAX_CONNECTIONS` sessions open."""

    def __init__(self, handler: Any, *, gate: _ConnectionGate, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._gate = gate

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
        return super()._getaddr(arg)  # type: ignore[no-any-return]

    async def _handle_client(self) -> None:
        if self._gate.open >= self._gate.limit:
            log.warning(
                "connection refused: too many open SMTP sessions",
                extra={"event": "smtp_connection_refused", "count": self._gate.open},
            )
            await self.push("421 4.7.0 Too many connections, try again later")
            if self.transport is not None:
                self.transport.close()
            return
        self._gate.open += 1
        try:
            await super()._handle_client()
        finally:
            self._gate.open -= 1


class SinkController(Controller):
    def __init__(self, handler: SinkHandler, settings: Settings, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.sink = handler
        self.gate = _ConnectionGate(settings.smtp_max_connections)

    def factory(self) -> SMTP:
        return _CappedSMTP(self.handler, gate=self.gate, **self.SMTP_kwargs)

    def start(self) -> None:
        super().start()
        # Start the parse processes, and connect to the database and the
        # broker, now, not with the first message.
        self._warming = asyncio.run_coroutine_threadsafe(self.sink.parser.warm(), self.loop)
        self.sink.warm()

    def stop(self, no_assert: bool = False) -> None:
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


def make_controller(settings: Settings) -> SinkController:
    from app.usecases import checks

    # A push's check is made here, not queued behind a slow provider's calls.
    handler = SinkHandler(settings, check_here=checks.in_process_check_for(settings))
    # Its matching parses in the parse pool: no message stalls the sink.
    checks.parse_with(handler.parser.parse_blocking)
    return SinkController(
        handler,
        settings,
        hostname=settings.smtp_host,
        port=settings.smtp_port,
        data_size_limit=settings.smtp_max_bytes,
        # Mail bytes exactly as sent: parsing is ours and never crashes.
        decode_data=False,
        ident="Signalbox sink",
        loop=new_event_loop(),
    )
