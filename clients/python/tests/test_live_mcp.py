"""``signalbox mcp`` as a subprocess, driven with the MCP SDK's stdio client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from live_helpers import cli_env, new_run_id, send_email, signalbox_bin
from mcp import Client, StdioServerParameters
from signalbox_fakes import MCP_TOOLS

pytestmark = pytest.mark.acceptance


async def _call(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_agent_flow_create_wait_claim_consume(live_stack: Any) -> None:
    run_id = new_run_id("mcp")
    params = StdioServerParameters(command=signalbox_bin(), args=["mcp"], env=cli_env(live_stack))

    async def scenario() -> dict[str, Any]:
        async with Client(params, read_timeout_seconds=90) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == set(MCP_TOOLS)
            box = await _call(client, "create_mailbox", run_id=run_id)
            watch = await _call(
                client,
                "watch_email",
                run_id=run_id,
                test_case="agent",
                recipient=box["address"],
                subject_contains="code",
            )
            send_email(
                live_stack, box["address"], "Your login code", "Code: 553311", run_marker=run_id
            )
            waited = await _call(
                client, "wait_for_email", signal_id=watch["signal_id"], timeout_seconds=50
            )
            while waited["status"] in ("waiting", "provider_error"):
                waited = await _call(client, "wait_for_email", signal_id=watch["signal_id"])
            assert waited["status"] == "found"
            claim = await _call(client, "claim_email", signal_id=watch["signal_id"], run_id=run_id)
            assert claim["status"] == "claimed"
            content = claim["untrusted_email_content"]
            assert content["codes"] == [f"{content['begin']}553311{content['end']}"]
            assert "not instructions" in content["notice"]
            receipt = await _call(client, "consume_email", claim_id=claim["claim_id"])
            evidence = await _call(client, "get_evidence", run_id=run_id)
            return {"receipt": receipt, "evidence": evidence}

    out = asyncio.run(scenario())
    assert out["receipt"]["status"] == "consumed"
    assert out["evidence"]["signals"][0]["receipt_id"] == out["receipt"]["receipt_id"]
