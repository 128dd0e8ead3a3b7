"""Console pages: thin front doors over the triage use cases.

Every page works without JavaScript; every POST carries the session's CSRF
token (else 403). Content (bodies, links, codes) is shown only on a
message's own page (``messages``), to a tenant whose namespace may see it,
never to an operator; everywhere else subjects are masked. One module per
group of pages; ``common`` holds what they share, the session dependency
among it.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.console.routes import dead_letters, inbox, messages, overview, sign_in, signals
from app.console.routes.common import STATIC_DIR, install_handlers

__all__ = ["install"]


def install(app: FastAPI) -> None:
    """Add the console's pages, static files and session answers to `app`."""
    install_handlers(app)
    for module in (sign_in, overview, inbox, dead_letters, signals, messages):
        app.include_router(module.router)
    app.mount("/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
