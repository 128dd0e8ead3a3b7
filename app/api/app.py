"""The HTTP API's part of the server (`app.server` mounts it beside the
console): its routes, what they read from `app.state`, and the lifespan that
runs the long-poll notifier and the inbox's live feed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from app.api.limits import LongPollGate
from app.api.notify import SignalNotifier
from app.api.routes import (
    chaos,
    claims,
    dead_letters,
    inbox,
    inbox_events,
    mailpit,
    messages,
    ops,
    signals,
    triage,
)
from app.infra.parse_pool import ParsePool
from app.settings import Settings
from app.usecases import checks
from app.web.inbox_feed import InboxFeed

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def lifespan_for(settings: Settings) -> Lifespan:
    """The server's lifespan: the inbox feed (the API's and the console's live
    events) and the long-poll notifier; it closes the first looks' parse pool."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        feed = InboxFeed()
        feed.start()
        app.state.inbox_feed = feed
        notifier = SignalNotifier(settings.database_url or "", on_message=feed.notified)
        notifier.start()
        app.state.notifier = notifier
        try:
            yield
        finally:
            parser = getattr(app.state, "parse_pool", None)
            if parser is not None:
                parser.close(wait_if_idle=True)
            notifier.stop()
            feed.stop()

    return lifespan


def install(app: FastAPI, settings: Settings) -> None:
    """Add the API's routes to `app`, and what they read from its state."""
    app.state.long_polls = LongPollGate(settings.max_long_polls)
    # A sink signal's first look is made by the API that created it. The
    # first looks made here parse what they match in a spawned process,
    # where the parse's CPU budget applies (started on the first parse;
    # closed by the lifespan).
    parser = ParsePool(workers=1)
    app.state.parse_pool = parser
    app.state.check_runner = checks.process_runner(settings, parse=parser.parse_blocking)
    for module in (
        signals,
        claims,
        messages,
        inbox_events,
        mailpit,
        inbox,
        dead_letters,
        triage,
        chaos,
        ops,
    ):
        app.include_router(module.router)
