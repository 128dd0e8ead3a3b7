"""The HTTP API: `create_app()` wires routes, errors and the long-poll notifier."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import errors
from app.api.inbox_feed import InboxFeed
from app.api.limits import LongPollGate
from app.api.middleware import GateMiddleware
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
from app.console import routes as console
from app.infra.parse_pool import ParsePool
from app.settings import Settings, get_settings
from app.usecases import checks


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

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
            parser.close(wait_if_idle=True)
            notifier.stop()
            feed.stop()

    app = FastAPI(
        title="Signalbox",
        version="0.1.0",
        summary="Wait for an expected email as a contract.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.long_polls = LongPollGate(settings.max_long_polls)
    # A sink signal's first look is made by the API that created it. The
    # first looks made here parse what they match in a spawned process,
    # where the parse's CPU budget applies (started on the first parse).
    parser = ParsePool(workers=1)
    app.state.check_runner = checks.process_runner(settings, parse=parser.parse_blocking)
    errors.install(app)
    app.add_middleware(GateMiddleware, settings=settings)
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
    console.install(app)
    return app
