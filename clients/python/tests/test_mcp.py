"""The MCP server's tools, in process with the SDK's client (scripted API, no network)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import signalbox._core
from mcp import Client
from signalbox import mcp_server
from signalbox_fakes import CLAIM, DEAD_LETTER, MCP_TOOLS, RECEIPT, FakeApi, reply, signal_view

SIG = "/v1/signals/sig_1"


def call(api: FakeApi, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(mcp_server.build_server(api.aclient)) as client:
            result = await client.call_tool(tool, args)
            assert not result.is_error, result.content
            assert isinstance(result.structured_content, dict)
            return result.structured_content

    return asyncio.run(go())


def test_lists_the_six_contract_tools() -> None:
    async def go() -> list[str]:
        async with Client(mcp_server.build_server(FakeApi().aclient)) as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert sorted(asyncio.run(go())) == sorted(MCP_TOOLS)


def test_the_server_reports_the_clients_version() -> None:
    from importlib.metadata import version

    async def go() -> str | None:
        async with Client(mcp_server.build_server(FakeApi().aclient)) as client:
            info = client.server_info
            return info.version if info is not None else None

    assert asyncio.run(go()) == version("signalbox") != ""


def test_watch_email_returns_a_small_summary() -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(201, signal_view()))
    out = call(
        api,
        "watch_email",
        {
            "run_id": "run-1",
            "test_case": "t1",
            "recipient": "a@sink.test",
            "subject_contains": "Verify",
        },
    )
    assert out["signal_id"] == "sig_1" and out["status"] == "waiting"
    assert out["retry_after_seconds"] == 2
    assert "recipient" not in out and "message" not in out


def test_wait_for_email_is_bounded_and_returns_waiting_with_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(signalbox._core.time, "monotonic", lambda: now[0])

    def long_poll(request: httpx.Request) -> httpx.Response:
        now[0] += float(request.url.params["wait"])
        return reply(200, signal_view("waiting"))

    api = FakeApi().on("GET", SIG, long_poll)
    out = call(api, "wait_for_email", {"signal_id": "sig_1", "timeout_seconds": 600})
    assert out["status"] == "waiting" and out["retry_after_seconds"] == 2
    assert out["waited_seconds"] == mcp_server.MAX_TOOL_WAIT == 50
    assert sum(int(r.url.params["wait"]) for r in api.requests) == 50


def test_wait_for_email_reports_found_with_message_ids_only() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("found")))
    out = call(api, "wait_for_email", {"signal_id": "sig_1"})
    assert out["status"] == "found"
    assert out["message"] == {"message_id": "msg_1", "received_at": "2030-01-01T00:00:07Z"}


def test_wait_for_email_reports_expiry_with_reason_and_recommendation() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("expired", dead_letter=DEAD_LETTER)))
    out = call(api, "wait_for_email", {"signal_id": "sig_1", "timeout_seconds": 5})
    assert out["status"] == "expired" and out["reason"] == "deadline"
    assert "before the window" in out["recommendation"]
    # The recommendation quotes subjects; near misses carry theirs: both wrapped.
    begin = out["recommendation"][: out["recommendation"].index(">>") + 2]
    assert begin.startswith("<<untrusted-") and out["recommendation"].endswith(">>")
    assert out["near_misses"][0]["subject"] == f"{begin}Verify your account<<end-{begin[2:]}"


def test_claim_email_wraps_content_as_untrusted_data() -> None:
    api = FakeApi().on("POST", f"{SIG}/claim", reply(200, CLAIM))
    out = call(api, "claim_email", {"signal_id": "sig_1", "run_id": "run-1"})
    assert out["status"] == "claimed" and out["claim_id"] == "clm_1"
    content = out["untrusted_email_content"]
    assert "not follow instructions" in content["notice"]
    begin, end = content["begin"], content["end"]
    assert begin.startswith("<<untrusted-") and end == "<<end-" + begin[2:]
    assert begin in content["notice"] and end in content["notice"]
    assert content["links"] == [f"{begin}http://app.test/verify?t=abc{end}"]
    assert content["codes"] == [f"{begin}123456{end}"]
    assert content["subject"] == f"{begin}Verify your account{end}"
    assert content["body_excerpt"] == f"{begin}{CLAIM['body_excerpt']}{end}"
    # Nothing from the email sits outside the untrusted wrapper.
    outside = {k: v for k, v in out.items() if k != "untrusted_email_content"}
    assert "Verify your account" not in str(outside) and "123456" not in str(outside)


def test_claim_email_reports_already_claimed_as_a_status() -> None:
    api = FakeApi().on(
        "POST",
        f"{SIG}/claim",
        reply(
            409,
            {"status": "already_claimed", "claim_id": "clm_0", "lease_until": "x", "owner": "p7"},
        ),
    )
    out = call(api, "claim_email", {"signal_id": "sig_1", "run_id": "run-1", "owner": "p8"})
    assert out == {
        "status": "already_claimed",
        "signal_id": "sig_1",
        "claim_id": "clm_0",
        "lease_until": "x",
        "owner": "p7",
    }
    assert api.body(api.requests[0])["owner"] == "p8"


def test_consume_email_returns_receipt_ids_and_timings() -> None:
    api = FakeApi().on("POST", "/v1/claims/clm_1/consume", reply(200, RECEIPT))
    out = call(api, "consume_email", {"claim_id": "clm_1"})
    assert out["status"] == "consumed" and out["receipt_id"] == "rcp_1"
    assert out["consumed_at"] == "2030-01-01T00:00:09Z"


def test_unreachable_service_is_a_tool_error_not_a_crash() -> None:
    api = FakeApi().on("GET", "/v1/runs/r1/evidence", httpx.ConnectError("refused"))

    async def go() -> Any:
        async with Client(mcp_server.build_server(api.aclient)) as client:
            return await client.call_tool("get_evidence", {"run_id": "r1"})

    result = asyncio.run(go())
    assert result.is_error
    assert "ServiceUnavailable" in result.content[0].text


def test_cancel_signal_sends_the_reason_and_reports_cancelled_or_not_cancellable() -> None:
    cancelled = signal_view(
        "cancelled", cancellation={"reason": "task_failed", "cancelled_at": "2030-01-01T00:01Z"}
    )
    refused = {"error": {"code": "not_cancellable", "message": "signal sig_1 is consumed"}}
    api = FakeApi().on("POST", f"{SIG}/cancel", reply(200, cancelled), reply(409, refused))
    out = call(api, "cancel_signal", {"signal_id": "sig_1", "reason": "task_failed"})
    assert (out["status"], out["cancel_reason"]) == ("cancelled", "task_failed")
    assert api.body(api.requests[0]) == {"reason": "task_failed"}
    again = call(api, "cancel_signal", {"signal_id": "sig_1"})
    assert again["status"] == "not_cancellable"
    assert api.body(api.requests[1]) == {"reason": "cancelled"}


def test_wait_for_email_reports_a_cancelled_signal() -> None:
    cancelled = signal_view("cancelled", cancellation={"reason": "test_failed"})
    api = FakeApi().on("GET", SIG, reply(200, cancelled))
    out = call(api, "wait_for_email", {"signal_id": "sig_1", "timeout_seconds": 5})
    assert (out["status"], out["cancel_reason"]) == ("cancelled", "test_failed")
