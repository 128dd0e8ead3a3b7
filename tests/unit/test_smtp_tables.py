"""The sink's SMTP sessions list only the names aiosmtpd builds its tables
from (`__dir__`, read for every connection): the commands, AUTH mechanisms
and handler hooks it finds are exactly those a full reflection finds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.smtp import SMTP

from app.settings import Settings
from app.smtp.handler import SinkHandler
from app.smtp.server import _CappedSMTP, _ConnectionGate


def all_names(obj: Any, prefix: str) -> set[str]:
    """What dir() would list without the shortcut (the object's own and its class's)."""
    return {n for n in object.__dir__(obj) if n.startswith(prefix)}


@pytest.fixture(scope="module")
def handler() -> SinkHandler:
    return SinkHandler(Settings())  # nothing is connected or started before a message


@pytest.fixture
def session(handler: SinkHandler) -> Iterator[_CappedSMTP]:
    loop = asyncio.new_event_loop()
    try:
        yield _CappedSMTP(handler, gate=_ConnectionGate(1), loop=loop)
    finally:
        loop.close()


def test_every_command_is_in_the_table(session: _CappedSMTP) -> None:
    commands = {n.removeprefix("smtp_") for n in all_names(session, "smtp_")}
    assert {"EHLO", "HELO", "MAIL", "RCPT", "DATA", "QUIT", "RSET", "NOOP"} <= commands
    assert set(session._smtp_methods) == commands


def test_every_auth_mechanism_is_in_the_table(session: _CappedSMTP) -> None:
    mechanisms = {n.removeprefix("auth_") for n in all_names(session, "auth_")}
    assert mechanisms == {"LOGIN", "PLAIN"}
    assert set(session._auth_methods) == mechanisms


def test_every_handler_hook_is_in_the_table(session: _CappedSMTP, handler: SinkHandler) -> None:
    hooks = {n.removeprefix("handle_") for n in all_names(handler, "handle_")}
    assert {"RCPT", "DATA"} <= hooks
    assert set(session._handle_hooks) == hooks


def test_the_tables_are_what_aiosmtpd_builds_for_its_own_session(handler: SinkHandler) -> None:
    loop = asyncio.new_event_loop()
    try:
        plain = SMTP(handler, loop=loop)  # dir() of aiosmtpd's class is not shortened
        ours = _CappedSMTP(handler, gate=_ConnectionGate(1), loop=loop)
    finally:
        loop.close()
    assert set(ours._smtp_methods) == set(plain._smtp_methods)
    assert set(ours._auth_methods) == set(plain._auth_methods)
