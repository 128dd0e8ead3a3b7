"""A scripted fake of the HTTP API for unit tests (httpx.MockTransport)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from signalbox import AsyncSignalbox, Signalbox, cli

Reply = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


def signal_view(result: str = "waiting", **extra: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "signal_id": "sig_1",
        "run_id": "run-1",
        "test_case": "t1",
        "status": result if result != "provider_error" else "waiting",
        "result": result,
        "recipient": "a@sink.test",
        "subject_contains": "Verify",
        "created_at": "2030-01-01T00:00:00Z",
        "received_after": "2030-01-01T00:00:00Z",
        "expires_at": "2030-01-01T00:02:00Z",
        "checks": 3,
        "max_checks": 30,
        "retry_after_seconds": 2 if result in ("waiting", "provider_error") else None,
        "last_check": {"at": "2030-01-01T00:00:05Z", "outcome": "no_match", "error_code": None},
        "message": None,
        "claim": None,
        "receipt": None,
        "dead_letter": None,
    }
    if result in ("found", "claimed", "consumed"):
        view["message"] = {
            "message_id": "msg_1",
            "received_at": "2030-01-01T00:00:07Z",
            "subject": "Verify your account",
            "recipient": "a@sink.test",
            "run_marker": "run-1",
        }
    view.update(extra)
    return view


MAILBOX = {
    "mailbox_id": "mbx_1",
    "address": "x@sink.test",
    "provider": "sink",
    "expires_at": "2030-01-01T01:00:00Z",
}

#: The MCP server's tools: the contract an agent relies on.
MCP_TOOLS = (
    "create_mailbox",
    "watch_email",
    "wait_for_email",
    "claim_email",
    "consume_email",
    "get_evidence",
    "get_message",
    "cancel_signal",
)


DEAD_LETTER = {
    "dead_letter_id": "dlq_1",
    "signal_id": "sig_1",
    "run_id": "run-1",
    "reason": "deadline",
    "state": "open",
    "created_at": "2030-01-01T00:02:00Z",
    "provider": "sink",
    "checks": {"total": 7, "by_outcome": {"no_match": 7}},
    "last_error_code": None,
    "near_misses": [
        {
            "message_id": "msg_0",
            "received_at": "2029-12-31T23:59:57Z",
            "subject": "Verify your account",
            "why": "received_before_window",
        }
    ],
    "recommendation": "A message to this recipient arrived 3 s before the window opened.",
}

CLAIM = {
    "status": "claimed",
    "claim_id": "clm_1",
    "message_id": "msg_1",
    "lease_until": "2030-01-01T00:01:37Z",
    "subject": "Verify your account",
    "received_at": "2030-01-01T00:00:07Z",
    "body_excerpt": "Click http://app.test/verify?t=abc or enter 123456",
    "links": ["http://app.test/verify?t=abc"],
    "codes": ["123456"],
}

RECEIPT = {
    "receipt_id": "rcp_1",
    "signal_id": "sig_1",
    "run_id": "run-1",
    "message_id": "msg_1",
    "claimed_at": "2030-01-01T00:00:08Z",
    "consumed_at": "2030-01-01T00:00:09Z",
    "evidence": {
        "recipient": "matched",
        "subject": "matched",
        "run_marker": "matched",
        "received_at": "2030-01-01T00:00:07Z",
        "received_after": "2030-01-01T00:00:00Z",
    },
}


def reply(status: int, body: Any = None) -> httpx.Response:
    return httpx.Response(status, json=body) if body is not None else httpx.Response(status)


@dataclass
class FakeApi:
    """Routes ``(METHOD, path)`` to queued replies; the last reply of a route repeats."""

    routes: dict[tuple[str, str], list[Reply]] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)

    def on(self, method: str, path: str, *replies: Reply) -> FakeApi:
        self.routes.setdefault((method, path), []).extend(replies)
        return self

    def calls(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def body(self, request: httpx.Request) -> Any:
        return json.loads(request.content) if request.content else None

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        queue = self.routes.get((request.method, request.url.path))
        if not queue:
            return reply(404, {"error": {"code": "not_found", "message": "no such route"}})
        item = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(item, Exception):
            raise item
        if callable(item):
            return item(request)
        return item

    async def ahandle(self, request: httpx.Request) -> httpx.Response:
        return self.handle(request)

    def client(self, retries: int = 2) -> Signalbox:
        sb = Signalbox(
            "http://sb.test", "tok", retries=retries, transport=httpx.MockTransport(self.handle)
        )
        sb._sleep = lambda _s: None
        return sb

    def aclient(self, retries: int = 2) -> AsyncSignalbox:
        sb = AsyncSignalbox(
            "http://sb.test", "tok", retries=retries, transport=httpx.MockTransport(self.ahandle)
        )

        async def no_sleep(_s: float) -> None:
            return None

        sb._sleep = no_sleep
        return sb


class FakeClock:
    """Stands in for time.monotonic; a long poll advances it by the wait asked for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def long_poll(self, result: str = "waiting") -> Callable[[httpx.Request], httpx.Response]:
        def respond(request: httpx.Request) -> httpx.Response:
            self.now += float(request.url.params.get("wait", "0"))
            return reply(200, signal_view(result))

        return respond


class ScriptedLongPoll:
    """A long poll that answers `waiting` for `waiting_seconds` of (fake) time, then
    `then`; each poll advances the fake clock by the wait it asked for."""

    def __init__(self, clock: FakeClock, waiting_seconds: float, then: dict[str, object]) -> None:
        self.clock, self.until, self.then = clock, clock.now + waiting_seconds, then

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.clock.now >= self.until:
            return reply(200, self.then)
        self.clock.now += float(request.url.params.get("wait", "0"))
        return reply(200, signal_view("waiting"))


def run_cli(api: FakeApi, *argv: str) -> tuple[int, str, str]:
    """``signalbox ARGV`` against ``api``: the exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err, client_factory=lambda u, t: api.client())
    return code, out.getvalue(), err.getvalue()
