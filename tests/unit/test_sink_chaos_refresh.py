"""The sink brings its chaos rules up to date once per mail transaction, and
starts doing so at MAIL FROM, so the round trip runs while the client's
first RCPT TO is on its way. A rule covering an address still answers that
RCPT TO; a transaction without the MAIL hook (a hook called directly) still
refreshes once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from aiosmtpd.smtp import Envelope, Session

from app.domain.chaos import ChaosStage
from app.settings import Settings
from app.smtp.handler import SinkHandler


class RecordingChaos:
    """No Redis (no version to read) and a copy never current: each
    transaction reloads its rules, counted; a reload blocks until `release`
    is set."""

    version_url = None

    def __init__(self, rules: tuple[Any, ...] = (), reply: str | None = None) -> None:
        self.refreshes = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.rules = rules
        self.reply = reply
        self.versions: list[bytes | None] = []

    def is_current(self, version: bytes | None) -> bool:
        self.versions.append(version)
        return False

    def reload(self, version: bytes | None) -> None:
        self.refreshes += 1
        self.started.set()
        assert self.release.wait(5)

    def reply_for(self, stage: ChaosStage, addresses: Sequence[str]) -> str | None:
        return self.reply


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_refresh_starts_at_mail_from_and_rcpt_waits_for_it() -> None:
    chaos = RecordingChaos()
    handler = SinkHandler(Settings(), chaos=chaos)  # type: ignore[arg-type]
    envelope = Envelope()

    async def transaction() -> list[str]:
        session = Session(asyncio.get_running_loop())
        answer = await handler.handle_MAIL(None, session, envelope, "a@x.test", ["BODY=8BITMIME"])  # type: ignore[arg-type]
        # Started before any RCPT TO arrived, and still running.
        assert await asyncio.to_thread(chaos.started.wait, 5)
        rcpt = asyncio.ensure_future(
            handler.handle_RCPT(None, session, envelope, "b@x.test", [])  # type: ignore[arg-type]
        )
        await asyncio.sleep(0.05)
        assert not rcpt.done()  # the answer waits for the rules
        chaos.release.set()
        first = await rcpt
        second = await handler.handle_RCPT(None, session, envelope, "c@x.test", [])  # type: ignore[arg-type]
        return [answer, first, second]

    assert _run(transaction()) == ["250 OK", "250 OK", "250 OK"]
    assert chaos.refreshes == 1  # once per transaction, not per recipient
    assert envelope.mail_from == "a@x.test"
    assert envelope.mail_options == ["BODY=8BITMIME"]
    assert envelope.rcpt_tos == ["b@x.test", "c@x.test"]


def test_a_rule_refreshed_at_mail_from_answers_the_rcpt() -> None:
    chaos = RecordingChaos(rules=(object(),), reply="451 4.3.0 Try again later")
    chaos.release.set()
    handler = SinkHandler(Settings(), chaos=chaos)  # type: ignore[arg-type]
    envelope = Envelope()

    async def transaction() -> str:
        session = Session(asyncio.get_running_loop())
        await handler.handle_MAIL(None, session, envelope, "a@x.test", [])  # type: ignore[arg-type]
        return await handler.handle_RCPT(None, session, envelope, "b@x.test", [])  # type: ignore[arg-type]

    assert _run(transaction()) == "451 4.3.0 Try again later"
    assert envelope.rcpt_tos == []
    assert chaos.refreshes == 1


def test_without_the_mail_hook_the_first_rcpt_refreshes_once() -> None:
    chaos = RecordingChaos()
    chaos.release.set()
    handler = SinkHandler(Settings(), chaos=chaos)  # type: ignore[arg-type]
    envelope = Envelope()

    async def transaction() -> list[str]:
        session = Session(asyncio.get_running_loop())
        return [
            await handler.handle_RCPT(None, session, envelope, f"{n}@x.test", [])  # type: ignore[arg-type]
            for n in "bc"
        ]

    assert _run(transaction()) == ["250 OK", "250 OK"]
    assert chaos.refreshes == 1


def test_without_chaos_mail_from_asks_nobody() -> None:
    handler = SinkHandler(Settings())
    envelope = Envelope()

    async def transaction() -> str:
        session = Session(asyncio.get_running_loop())
        return await handler.handle_MAIL(None, session, envelope, "a@x.test", [])  # type: ignore[arg-type]

    answer = _run(transaction())
    assert answer == "250 OK"
    assert envelope.mail_from == "a@x.test"
    assert not hasattr(envelope, "chaos_refresh")


class FailingChaos(RecordingChaos):
    def reload(self, version: bytes | None) -> None:
        self.refreshes += 1
        raise RuntimeError("redis and postgresql both gone")


class CurrentChaos(RecordingChaos):
    """A copy that is its version's and young: nothing to reload."""

    def is_current(self, version: bytes | None) -> bool:
        self.versions.append(version)
        return True


class NoThreads:
    """An executor that fails the test when anything is handed to it."""

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a thread was asked for the chaos rules")

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_a_current_copy_costs_a_transaction_no_thread() -> None:
    chaos = CurrentChaos()
    handler = SinkHandler(Settings(), chaos=chaos)  # type: ignore[arg-type]
    handler._chaos_thread.shutdown()
    handler._chaos_thread = NoThreads()  # type: ignore[assignment]
    envelope = Envelope()

    async def transaction() -> list[str]:
        session = Session(asyncio.get_running_loop())
        return [
            await handler.handle_MAIL(None, session, envelope, "a@x.test", []),  # type: ignore[arg-type]
            await handler.handle_RCPT(None, session, envelope, "b@x.test", []),  # type: ignore[arg-type]
        ]

    assert _run(transaction()) == ["250 OK", "250 OK"]
    assert chaos.versions == [None]  # asked once, with no Redis to read
    assert chaos.refreshes == 0
    assert envelope.rcpt_tos == ["b@x.test"]


def test_a_failed_refresh_of_a_transaction_given_up_before_rcpt_is_not_reported() -> None:
    import gc

    chaos = FailingChaos()
    handler = SinkHandler(Settings(), chaos=chaos)  # type: ignore[arg-type]
    reported: list[dict[str, Any]] = []

    async def transaction() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        envelope = Envelope()
        session = Session(loop)
        await handler.handle_MAIL(None, session, envelope, "a@x.test", [])  # type: ignore[arg-type]
        refresh = envelope.chaos_refresh  # type: ignore[attr-defined]
        await asyncio.wait([refresh])
        del envelope, refresh  # the client sent RSET or QUIT: nobody awaits it
        gc.collect()
        await asyncio.sleep(0)

    _run(transaction())
    assert chaos.refreshes == 1
    assert reported == []


def test_a_failed_refresh_still_fails_the_rcpt_that_waits_for_it() -> None:
    chaos = FailingChaos()
    handler = SinkHandler(Settings(), chaos=chaos)  # type: ignore[arg-type]
    envelope = Envelope()

    async def transaction() -> str:
        session = Session(asyncio.get_running_loop())
        await handler.handle_MAIL(None, session, envelope, "a@x.test", [])  # type: ignore[arg-type]
        return await handler.handle_RCPT(None, session, envelope, "b@x.test", [])  # type: ignore[arg-type]

    try:
        _run(transaction())
    except RuntimeError as exc:
        assert "gone" in str(exc)
    else:
        raise AssertionError("the RCPT TO was answered without its rules")
    assert envelope.rcpt_tos == []
