"""The sink reads the chaos rules' version from the real Redis on its event
loop, and re-reads the rules from the real PostgreSQL only when that version
moved: a transaction with nothing changed crosses no thread for them."""

from __future__ import annotations

import asyncio

import pytest
from aiosmtpd.smtp import Envelope, Session

from app.infra.redis import client_for
from app.settings import get_settings
from app.smtp.handler import SinkHandler
from app.usecases.chaos import VERSION_KEY, SinkChaos

pytestmark = pytest.mark.integration


class CountedChaos(SinkChaos):
    def __init__(self) -> None:
        super().__init__(get_settings())
        self.reloads: list[bytes | None] = []

    def reload(self, version: bytes | None) -> None:
        self.reloads.append(version)
        super().reload(version)


def test_the_version_is_read_on_the_loop_and_the_rules_only_when_it_moves(
    in_process: None,
) -> None:
    chaos = CountedChaos()
    assert chaos.version_url is not None
    handler = SinkHandler(get_settings(), chaos=chaos)
    redis = client_for(chaos.version_url)

    async def transactions() -> list[str]:
        answers = []
        for n in range(3):
            if n == 2:
                redis.incr(VERSION_KEY)  # what a change of any namespace's rules does
            envelope = Envelope()
            session = Session(asyncio.get_running_loop())
            await handler.handle_MAIL(None, session, envelope, "a@x.test", [])  # type: ignore[arg-type]
            answers.append(await handler.handle_RCPT(None, session, envelope, f"{n}@x.test", []))  # type: ignore[arg-type]
        await handler.aclose()
        return answers

    try:
        assert asyncio.run(transactions()) == ["250 OK"] * 3
    finally:
        handler.close()
    # Never set: version b"0", loaded once; the same version again: nothing
    # read; moved: read again, as that version.
    assert chaos.reloads == [b"0", b"1"]
    assert chaos.is_current(b"1")
    assert not chaos.is_current(b"2")
