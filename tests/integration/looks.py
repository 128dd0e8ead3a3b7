"""Signals created and looked at in this process, on the test's own
PostgreSQL and Redis (the `looks` fixture): the first look, whole or in one
statement, and the found write, without a stack's processes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from sqlalchemy import Connection

from app.settings import Settings, get_settings
from app.usecases import signals
from app.usecases.checks import CheckRequest, CheckRunner, process_runner
from app.usecases.inputs import SignalCreate
from tests.integration.helpers import mail


class Recording(CheckRunner):
    """This process's check runner, each one-statement first look's answer
    kept in `looks` (`quick` False: that look is not tried; `now` False: the
    create leaves its first look for later, `Created.first_look`)."""

    def __init__(
        self, settings: Settings, looks: Looks, *, quick: bool = True, now: bool = True
    ) -> None:
        real = process_runner(settings)
        super().__init__(settings, providers=real.deps.providers, breakers=real.deps.breakers)
        self.looks, self.use_quick, self.now = looks, quick, now

    def first_look_now(self, request: CheckRequest, session: Connection) -> CheckRequest | None:
        return super().first_look_now(request, session) if self.now else request

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
        self.rows[row["id"]] = row
        self.quick[row["id"]] = answer = self.real(row, session)
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
