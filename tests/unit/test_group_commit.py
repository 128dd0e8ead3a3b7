"""The sink's group commit (batching, order, caps, failure isolation) and what
the sink does around it: the memory bound on held messages, the warm start."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from app.smtp.batching import GroupCommit


class Store:
    """A store_many that records its calls; the first call waits for `release`
    so the test can queue items behind it, and items named in `refuse` fail."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.calls: list[list[str]] = []
        self.refuse = refuse
        self.release = threading.Event()
        self.first_started = threading.Event()

    def __call__(self, items: Sequence[str]) -> list[str]:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.first_started.set()
            self.release.wait(5)
        if self.refuse & set(items):
            raise ValueError("refused")
        return [f"id-{item}" for item in items]


async def _wait(event: threading.Event) -> None:
    await asyncio.get_running_loop().run_in_executor(None, event.wait, 5)


def _batcher(store: Store, executor: ThreadPoolExecutor, **kwargs: object) -> GroupCommit[str, str]:
    return GroupCommit(store, executor, size_of=len, **kwargs)  # type: ignore[arg-type]


def _behind_first(store: Store, first: str, items: Sequence[str], **kwargs: object) -> list[object]:
    """Submit `first`; while it commits alone, submit `items`; then let the
    commit end. The results in submission order (exceptions as values)."""

    async def scenario() -> list[object]:
        with ThreadPoolExecutor(1) as executor:
            batcher = _batcher(store, executor, **kwargs)
            head = asyncio.create_task(batcher.submit(first))
            await _wait(store.first_started)  # `first` is committing: nothing waited for it
            rest = [asyncio.create_task(batcher.submit(x)) for x in items]
            await asyncio.sleep(0)
            store.release.set()
            return await asyncio.gather(head, *rest, return_exceptions=True)

    return asyncio.run(scenario())


def test_items_that_arrive_during_a_commit_share_the_next_one_in_order() -> None:
    store = Store()
    stored: list[tuple[list[str], list[str]]] = []

    def on_stored(items: Sequence[str], ids: Sequence[str]) -> None:
        stored.append((list(items), list(ids)))

    results = _behind_first(store, "a", ["b", "c", "d"], on_stored=on_stored)
    assert results == ["id-a", "id-b", "id-c", "id-d"]
    assert store.calls == [["a"], ["b", "c", "d"]]
    assert stored == [(["a"], ["id-a"]), (["b", "c", "d"], ["id-b", "id-c", "id-d"])]


def test_a_batch_keeps_to_its_item_and_byte_caps_and_a_big_item_goes_alone() -> None:
    store = Store()
    items = ["a", "b", "c", "d", "e", "f" * 20, "gggg", "hhhh", "iiii"]
    results = _behind_first(store, "x", items, max_items=3, max_bytes=10)
    assert results == [f"id-{x}" for x in ["x", *items]]
    assert store.calls == [
        ["x"],
        ["a", "b", "c"],
        ["d", "e"],  # "f"*20 would pass 10 bytes
        ["f" * 20],  # over the byte cap alone: still stored
        ["gggg", "hhhh"],
        ["iiii"],
    ]


def test_one_refused_item_fails_alone_and_the_rest_of_its_batch_is_stored() -> None:
    store = Store(refuse=frozenset({"bad"}))
    stored: list[list[str]] = []
    results = _behind_first(
        store, "a", ["b", "bad", "c"], on_stored=lambda _, ids: stored.append(list(ids))
    )
    assert results[0] == "id-a" and results[1] == "id-b" and results[3] == "id-c"
    assert isinstance(results[2], ValueError)
    assert store.calls == [["a"], ["b", "bad", "c"], ["b"], ["bad"], ["c"]]
    assert stored == [["id-a"], ["id-b"], ["id-c"]]


def test_a_store_that_miscounts_its_results_fails_every_submitter() -> None:
    async def scenario() -> None:
        with ThreadPoolExecutor(1) as executor:
            batcher: GroupCommit[str, str] = GroupCommit(lambda items: [], executor, size_of=len)
            with pytest.raises(RuntimeError):
                await batcher.submit("a")

    asyncio.run(scenario())


def test_a_failure_no_single_item_caused_fails_the_whole_batch_at_once() -> None:
    store = Store(refuse=frozenset({"bad"}))
    results = _behind_first(store, "a", ["b", "bad", "c"], split_on=lambda exc: False)
    assert results[0] == "id-a"
    assert all(isinstance(r, ValueError) for r in results[1:])
    assert store.calls == [["a"], ["b", "bad", "c"]]


def test_the_sink_splits_a_batch_on_a_refused_value_not_on_an_unreachable_database() -> None:
    from sqlalchemy.exc import DataError, IntegrityError, OperationalError

    from app.smtp.handler import _one_message_may_cause

    cause = Exception("from the driver")
    assert _one_message_may_cause(DataError("INSERT", {}, cause))
    assert _one_message_may_cause(IntegrityError("INSERT", {}, cause))
    assert not _one_message_may_cause(OperationalError("INSERT", {}, cause))


def test_the_sink_connects_on_its_push_thread_at_start_not_with_the_first_mail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from app.smtp.handler import SinkHandler
    from app.usecases import intake

    warmed = threading.Event()
    seen: list[tuple[object, str]] = []

    def warm(settings: object) -> None:
        seen.append((settings, threading.current_thread().name))
        warmed.set()

    monkeypatch.setattr(intake, "warm", warm)
    settings = SimpleNamespace(accepted_domains=(), smtp_max_bytes=1024)
    handler = SinkHandler(settings)  # type: ignore[arg-type]
    try:
        handler.warm()
        assert warmed.wait(5)
    finally:
        handler.close()
    [(warmed_with, thread)] = seen
    assert warmed_with is settings
    assert thread.startswith("sink-push")


def stored_as(sink_ids: Iterable[int]) -> list[Any]:
    """What the sink's store answers for these sink ids."""
    from app.usecases import intake

    now = datetime.now(UTC)
    return [intake.StoredMail(i, f"msg_{i:024x}", now) for i in sink_ids]


def test_the_sink_holds_at_most_its_bound_of_stored_messages_for_parsing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A flood while parses (or the broker) are slow: past MAX_PENDING_PARSES
    a stored message is not held in memory, but its To and Cc are not
    dropped: they are read from its header block alone and added."""
    from types import SimpleNamespace

    from app.smtp import handler as handler_mod
    from app.usecases import intake

    release = threading.Event()
    pushed: list[int] = []

    def slow_triage(raw: bytes, rcpts: Sequence[str]) -> bool:
        release.wait(10)
        return False

    def push_many(
        settings: object, stored: Sequence[intake.Stored], *, runner: object = None
    ) -> list[None]:
        pushed.extend(i for ids, _ in stored for i in ids)
        return [None] * len(stored)

    added: dict[int, list[str]] = {}

    def add_recipients(session: object, sink_id: int, extra: list[str]) -> None:
        added[sink_id] = extra

    monkeypatch.setattr(intake, "needs_parse", slow_triage)
    monkeypatch.setattr(intake, "push_many", push_many)
    monkeypatch.setattr(intake, "record_stored", lambda *args: None)
    monkeypatch.setattr(intake, "push", lambda *args, **kwargs: None)
    monkeypatch.setattr(intake.sink_messages_db, "sink_message_add_recipients", add_recipients)
    monkeypatch.setattr(intake, "autocommit", contextlib.nullcontext)
    settings = SimpleNamespace(accepted_domains=(), smtp_max_bytes=1024)
    bound = handler_mod.MAX_PENDING_PARSES

    async def scenario() -> tuple[int, int]:
        sink = handler_mod.SinkHandler(settings)  # type: ignore[arg-type]
        try:
            count = bound + 5
            # Larger than a message looked at on the event loop: each is held.
            head = b"To: a@example.test\r\nCc: Audit <Audit@example.test>\r\n\r\n"
            raw = head + b"x" * (handler_mod.INLINE_SCAN_BYTES + 1)
            received = [(None, ["a@example.test"], raw) for _ in range(count)]
            sink._after_store(received, stored_as(range(count)))
            held = sink.parses_waiting
            release.set()
            while sink.pending:
                await asyncio.gather(*sink.pending)
            return held, sink.parses_waiting
        finally:
            sink.close()

    with caplog.at_level("WARNING", logger="signalbox.smtp"):
        held, after = asyncio.run(scenario())
    assert held == bound
    assert after == 0
    headers_only = [
        r for r in caplog.records if getattr(r, "event", None) == "sink_parse_headers_only"
    ]
    assert len(headers_only) == 5
    # The five not held for a parse still got their Cc (the held ones are
    # parsed: their triage, made slow here, says there is nothing to add).
    assert added == {i: ["audit@example.test"] for i in range(bound, bound + 5)}
    assert sorted(pushed) == list(range(bound + 5))  # every stored message is pushed


def test_a_small_message_naming_only_its_envelope_is_looked_at_on_the_loop_and_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to INLINE_SCAN_BYTES the look for more recipients is made on the
    event loop: a message whose To and Cc name only envelope recipients is
    then neither held nor handed to a thread; one naming another address is
    held for its parse, not looked at again; a larger message is looked at
    in a thread, as before."""
    from types import SimpleNamespace

    from app.domain.mail import ParsedMail
    from app.smtp import handler as handler_mod
    from app.usecases import intake

    looked: list[tuple[bytes, str]] = []
    real_needs_parse = intake.needs_parse

    def needs_parse(raw: bytes, rcpts: Sequence[str]) -> bool:
        looked.append((raw, threading.current_thread().name))
        return real_needs_parse(raw, rcpts)

    def push_many(
        settings: object, stored: Sequence[intake.Stored], *, runner: object = None
    ) -> list[None]:
        return [None] * len(stored)

    parsed: list[bytes] = []

    async def parse(raw: bytes) -> ParsedMail | None:
        parsed.append(raw)
        return None  # the message keeps its envelope recipients

    monkeypatch.setattr(intake, "needs_parse", needs_parse)
    monkeypatch.setattr(intake, "push_many", push_many)
    monkeypatch.setattr(intake, "record_stored", lambda *args: None)
    settings = SimpleNamespace(accepted_domains=(), smtp_max_bytes=1024)
    head = b"From: app@example.test\r\nTo: a@example.test\r\n"
    plain = head + b"Subject: hi\r\n\r\nbody\r\n"
    other = head + b"Cc: b@example.test\r\nSubject: hi\r\n\r\nbody\r\n"
    large = plain + b"x" * (handler_mod.INLINE_SCAN_BYTES + 1 - len(plain))
    edge = plain + b"x" * (handler_mod.INLINE_SCAN_BYTES - len(plain))

    async def scenario() -> tuple[int, str]:
        sink = handler_mod.SinkHandler(settings)  # type: ignore[arg-type]
        monkeypatch.setattr(sink.parser, "parse", parse)
        try:
            loop_thread = threading.current_thread().name
            received = [(None, ["a@example.test"], raw) for raw in (plain, edge, other, large)]
            sink._after_store(received, stored_as([1, 2, 3, 4]))
            held = sink.parses_waiting
            while sink.pending:
                await asyncio.gather(*sink.pending)
            return held, loop_thread
        finally:
            sink.close()

    held, loop_thread = asyncio.run(scenario())
    assert held == 2  # `other` for its parse, `large` for its look
    by_message = {raw: thread for raw, thread in looked}
    assert len(looked) == 4  # each message looked at once
    assert by_message[plain] == by_message[edge] == by_message[other] == loop_thread
    assert by_message[large].startswith("sink-after")
    assert parsed == [other]  # `large` names only its envelope: not parsed


@pytest.mark.parametrize("push_hangs", [False, True], ids=["push-done", "push-hangs"])
def test_a_batch_is_recorded_after_its_push_or_its_bound_whichever_comes_first(
    monkeypatch: pytest.MonkeyPatch, push_hangs: bool
) -> None:
    """The inbox record of a stored batch (a parse and an insert) starts
    once the batch's push is done, so the two do not compete for the cores
    while a test waits for its signal; a push that hangs holds the record
    back RECORD_AFTER_PUSH_SECONDS at most."""
    from types import SimpleNamespace

    from app.smtp import handler as handler_mod
    from app.usecases import intake

    events: list[str] = []
    release = threading.Event()

    def push_many(
        settings: object, stored: Sequence[intake.Stored], *, runner: object = None
    ) -> list[None]:
        events.append("push started")
        if push_hangs:  # until the record has been made
            release.wait(10)
        events.append("push done")
        return [None] * len(stored)

    def record_stored(*args: object) -> None:
        events.append("recorded")

    monkeypatch.setattr(intake, "push_many", push_many)
    monkeypatch.setattr(intake, "record_stored", record_stored)
    # The bound: short where the push hangs, far longer than any push here.
    monkeypatch.setattr(handler_mod, "RECORD_AFTER_PUSH_SECONDS", 0.2 if push_hangs else 30)
    settings = SimpleNamespace(accepted_domains=(), smtp_max_bytes=1024)
    raw = b"From: app@example.test\r\nTo: a@example.test\r\nSubject: hi\r\n\r\nbody\r\n"

    async def scenario() -> None:
        sink = handler_mod.SinkHandler(settings)  # type: ignore[arg-type]
        try:
            sink._after_store([(None, ["a@example.test"], raw)], stored_as([1]))
            deadline = time.monotonic() + 10
            while "recorded" not in events and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            release.set()
            while sink.pending:
                await asyncio.gather(*sink.pending)
        finally:
            release.set()
            sink.close()

    asyncio.run(scenario())
    if push_hangs:  # recorded while the push still hung
        assert sorted(events) == ["push done", "push started", "recorded"]
        assert events[-1] == "push done"
    else:
        assert events == ["push started", "push done", "recorded"]
