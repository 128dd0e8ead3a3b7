"""Signals created and looked at in this process, on the test's own
PostgreSQL and Redis (the `looks` fixture): the first look, whole or in one
statement, and the found write, without a stack's processes."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection

from app.db.create_look import FirstLook
from app.db.engine import autocommit
from app.settings import Settings, get_settings
from app.usecases import signals
from app.usecases.checks import CheckRequest, CheckRunner, process_runner
from app.usecases.checks.first import presumed_look_made
from app.usecases.inputs import SignalCreate
from tests.integration.helpers import mail


class Recording(CheckRunner):
    """This process's check runner, each one-statement first look's answer
    kept in `looks`, whether the create's statement made it or the look's
    own (`quick` False: neither is tried; `now` False: the create leaves its
    first look for later, `Created.first_look`)."""

    def __init__(
        self, settings: Settings, looks: Looks, *, quick: bool = True, now: bool = True
    ) -> None:
        real = process_runner(settings)
        super().__init__(settings, providers=real.deps.providers, breakers=real.deps.breakers)
        self.looks, self.use_quick, self.now = looks, quick, now

    def presumed_look(self, values: Mapping[str, Any]) -> FirstLook | None:
        return super().presumed_look(values) if self.use_quick and self.now else None

    def after_created(
        self, request: CheckRequest, session: Connection, seconds: float
    ) -> CheckRequest | None:
        if not self.now:
            return request
        assert request.created is not None
        if self.use_quick:
            self.looks.made(request.created, presumed_look_made(request.created))
        return super().after_created(request, session, seconds)

    def quick_look(self, created: Mapping[str, Any], session: Connection | None = None) -> bool:
        if not self.use_quick:
            return False
        return self.looks.record(created, session)


class Looks:
    """Creates sink signals in this process; `quick[id]` is what the
    one-statement look answered for each (absent: it was not asked)."""

    def __init__(self) -> None:
        self.settings = get_settings()
        self.real = process_runner(self.settings).quick_look
        self.quick: dict[str, bool] = {}
        self.rows: dict[str, Mapping[str, Any]] = {}

    def record(self, row: Mapping[str, Any], session: Connection | None = None) -> bool:
        return self.made(row, self.real(row, session))

    def made(self, row: Mapping[str, Any], answer: bool) -> bool:
        """Keep what a one-statement first look of `row` answered (made by
        the create's statement, or by the look's own)."""
        self.rows[row["id"]] = row
        self.quick[row["id"]] = answer
        return answer

    def runner(self, *, quick: bool = True, now: bool = True) -> CheckRunner:
        """A check runner as the API's, its one-statement first looks recorded
        here (`now` False: made after the create, by `Created.first_look`)."""
        return Recording(self.settings, self, quick=quick, now=now)

    def create(self, *, quick: bool = True, look: bool = True, **fields: Any) -> str:
        """A new signal (fresh recipient unless given, in namespace
        `default` unless given); its first look made unless `look` is False."""
        namespace = fields.pop("namespace", "default")
        req = SignalCreate(
            run_id=fields.pop("run_id", f"run-{uuid.uuid4().hex[:6]}"),
            test_case=fields.pop("test_case", f"case-{uuid.uuid4().hex[:6]}"),
            recipient=fields.pop("recipient", f"q-{uuid.uuid4().hex[:8]}@example.test"),
            expires_in_seconds=fields.pop("expires_in_seconds", 300),
            **fields,
        )
        created = signals.signal_create(
            self.settings, namespace, req, None, runner=self.runner(quick=quick, now=look)
        )
        assert created.created
        signal_id = str(created.view["signal_id"])
        if look and created.first_look is not None:  # not made with the create
            created.first_look()
        return signal_id


def sql(statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(str(get_settings().database_url), autocommit=True) as conn:
        cursor = conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def store(
    recipient: str, *, at: str = "now()", envelope: bool = True, subject: str | None = None
) -> None:
    """A sink message to `recipient` received at `at` (SQL), with no push;
    `envelope` False: named only in its headers (all_recipients)."""
    data = mail(recipient) if subject is None else mail(recipient, subject=subject)
    sql(
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size,"
        f" raw, received_at) VALUES ('app@example.test', %s, %s, %s, %s, {at})",
        [recipient] if envelope else ["other@example.test"],
        [recipient] if envelope else ["other@example.test", recipient],
        len(data),
        data,
    )


@contextlib.contextmanager
def wal_counted() -> Iterator[tuple[Connection, psycopg.Connection[Any]]]:
    """An autocommit session and its driver connection, whose own WAL writes
    `wal_writes` reads; skips the test before PostgreSQL 18."""
    with autocommit() as session:
        conn = session.connection.driver_connection
        assert conn is not None
        if conn.info.server_version < 180000:
            pytest.skip("per-backend I/O statistics need PostgreSQL 18")
        yield session, conn


def wal_writes(conn: psycopg.Connection[Any]) -> int:
    """WAL writes this connection's backend made itself, so far (PostgreSQL
    18's per-backend I/O statistics): a commit that waited for its flush
    adds one."""
    conn.execute("SELECT pg_stat_force_next_flush()")  # reported once it is idle
    conn.execute("SELECT 1")
    row = conn.execute(
        "SELECT coalesce(sum(writes), 0) FROM pg_stat_get_backend_io(pg_backend_pid())"
        " WHERE object = 'wal'"
    ).fetchone()
    assert row is not None
    return int(row[0])
