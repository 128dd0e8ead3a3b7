"""The HTTP server: `create_app()` mounts the API and the console side by side.

Neither front door imports the other; what both use lives in `app/web/`.
Installed here for both: the JSON error answers (`app.api.errors`), the
front gate (`app.api.middleware`: tokens on `/v1`, the body limit, HSTS on
the console), then the API's routes before the console's."""

from __future__ import annotations

from fastapi import FastAPI

from app.api import app as api
from app.api import errors
from app.api.middleware import GateMiddleware
from app.console import routes as console
from app.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="Signalbox",
        version="0.1.0",
        summary="Wait for an expected email as a contract.",
        lifespan=api.lifespan_for(settings),
    )
    app.state.settings = settings
    errors.install(app)
    app.add_middleware(GateMiddleware, settings=settings)
    api.install(app, settings)
    console.install(app)
    return app
