"""`GET /v1/messages/events`: 200 subscribers on one API process, each of
A's gets a mail to A within seconds of its 250; B's never see it; the API
grows no thread and no database connection per subscriber."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.security.conftest import OPS_TOKEN, TOKEN_A, TOKEN_B
from tests.security.test_inbox import plain, send
from tests.stack import Stack

pytestmark = pytest.mark.integration

A_SUBSCRIBERS = 190
B_SUBSCRIBERS = 10


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


def connections(stack: Stack) -> int:
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def subscribe(
    client: httpx.AsyncClient, token: str, opened: asyncio.Event, events: list[dict[str, Any]]
) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with client.stream("GET", "/v1/messages/events", headers=headers) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        opened.set()
        event = None
        async for line in answer.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "message":
                events.append(json.loads(line[6:]))


def test_two_hundred_subscribers_hear_their_own_mail_and_nothing_else(
    tenancy_stack: Stack,
) -> None:
    api_pid = tenancy_stack.procs["api"].pid
    to_a = f"live-{uuid.uuid4().hex[:6]}@team-a.test"
    to_b = f"live-{uuid.uuid4().hex[:6]}@team-b.test"
    with tenancy_stack.client(OPS_TOKEN) as ops:
        assert ops.get("/v1/messages/events").status_code == 403

    async def scenario() -> tuple[
        list[list[dict[str, Any]]], list[list[dict[str, Any]]], float, int, int
    ]:
        threads_before, conns_before = threads_of(api_pid), connections(tenancy_stack)
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=tenancy_stack.api_url, limits=limits, timeout=httpx.Timeout(60, read=None)
        ) as client:
            heard_a: list[list[dict[str, Any]]] = [[] for _ in range(A_SUBSCRIBERS)]
            heard_b: list[list[dict[str, Any]]] = [[] for _ in range(B_SUBSCRIBERS)]
            opened = [asyncio.Event() for _ in range(A_SUBSCRIBERS + B_SUBSCRIBERS)]
            tasks = [
                asyncio.create_task(subscribe(client, TOKEN_A, opened[i], heard_a[i]))
                for i in range(A_SUBSCRIBERS)
            ] + [
                asyncio.create_task(
                    subscribe(client, TOKEN_B, opened[A_SUBSCRIBERS + i], heard_b[i])
                )
                for i in range(B_SUBSCRIBERS)
            ]
            await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 60)
            threads_open, conns_open = threads_of(api_pid), connections(tenancy_stack)
            loop = asyncio.get_running_loop()
            began = time.monotonic()
            mid_a = await loop.run_in_executor(
                None, send, tenancy_stack, plain(to_a, "live A"), [to_a]
            )
            await loop.run_in_executor(None, send, tenancy_stack, plain(to_b, "live B"), [to_b])
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not all(
                any(e["message_id"] == mid_a for e in h) for h in heard_a
            ):
                await asyncio.sleep(0.05)
            took = time.monotonic() - began
            await asyncio.sleep(1.0)  # B's mail has had its time too
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return (
            heard_a,
            heard_b,
            took,
            threads_open - threads_before,
            conns_open - conns_before,
        )

    heard_a, heard_b, took, more_threads, more_conns = asyncio.run(scenario())
    for heard in heard_a:
        ids = [e["message_id"] for e in heard]
        assert len(ids) == 1, heard  # A's mail once; B's never
        assert heard[0]["to"] == [to_a] and heard[0]["subject"] == "live A"
    for heard in heard_b:
        assert all(e["to"] == [to_b] for e in heard), heard
        assert len(heard) == 1
    print(f"all {A_SUBSCRIBERS} of A heard it {took:.3f} s after sending began")
    assert took < 5, took
    # No thread and no database connection per subscriber.
    assert more_threads < 10, more_threads
    assert more_conns < 5, more_conns
