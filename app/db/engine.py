"""Engine and sessions. One engine per process, created lazily from settings."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from app.settings import Settings, get_settings, to_sqlalchemy_url

_lock = threading.Lock()
_engines: dict[tuple[int, str], Engine] = {}


def make_engine(
    url: str, *, pool_size: int = 10, statement_timeout_ms: int = 0, lock_timeout_ms: int = 0
) -> Engine:
    """An engine whose sessions never wait unbounded: `statement_timeout` and
    `lock_timeout` (milliseconds, 0 = none) are set on every connection."""
    options = (
        f"-c statement_timeout={int(statement_timeout_ms)} -c lock_timeout={int(lock_timeout_ms)}"
    )
    return create_engine(
        to_sqlalchemy_url(url),
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=20,
        connect_args={"options": options, "connect_timeout": 10},
    )


def get_engine(settings: Settings | None = None) -> Engine:
    """The process's engine. Keyed by pid so a forked Celery child never
    reuses its parent's connections."""
    settings = settings or get_settings()
    key = (os.getpid(), settings.sqlalchemy_url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = make_engine(
                settings.sqlalchemy_url,
                statement_timeout_ms=settings.db_statement_timeout_ms,
                lock_timeout_ms=settings.db_lock_timeout_ms,
            )
            _engines[key] = engine
        return engine


def dispose_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=False)
        _engines.clear()
        _factories.clear()


# One session factory per engine: `sessionmaker()` builds a new Session
# class each time, whose event plumbing cost more than a short transaction.
_factories: dict[Engine, sessionmaker[Session]] = {}


def _factory(engine: Engine) -> sessionmaker[Session]:
    factory = _factories.get(engine)
    if factory is None:
        with _lock:
            factory = _factories.setdefault(
                engine, sessionmaker(bind=engine, expire_on_commit=False)
            )
    return factory


@contextmanager
def transaction(engine: Engine | None = None) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception."""
    with _factory(engine or get_engine())() as session, session.begin():
        yield session
