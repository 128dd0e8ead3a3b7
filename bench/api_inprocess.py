"""CPU per API request with no HTTP server: `create_app()` called over ASGI.

Starts the stack (`bench/_stack.running_stack`, without Flower) for its
database, Redis and sink, then builds the API app in this process from the
stack's settings and calls it directly, one request at a time: what the
routes, dependencies, middleware, use cases and database client cost,
without uvicorn, the socket or the client. The difference to
`bench/requests.py` (same steps through the real server) is the server's
share.

Steps: `create` (a new sink signal each time, its first look included:
the look runs in this process once the answer is sent) and `read`
(`GET /v1/signals/{id}` of one waiting signal).

To see where a step's CPU goes, run it under py-spy:

    uv run py-spy record --gil -r 400 -f raw -o /tmp/read.txt -- \
        python bench/api_inprocess.py --step read --count 6000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import uuid
from typing import Any

import _machine
import _stack


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class InProcessApi:
    """Calls an ASGI app as uvicorn would, with a bearer token."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        headers = [(b"host", b"api"), (b"authorization", b"Bearer " + self.token)]
        if body is not None:
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "root_path": "",
            "state": {},
        }
        sent: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": data, "more_body": False}
            await asyncio.Event().wait()  # never disconnects
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        body_bytes = b"".join(m.get("body", b"") for m in sent[1:])
        return sent[0]["status"], json.loads(body_bytes or b"null")


async def _measure(app: Any, token: str, step: str, count: int) -> tuple[float, float]:
    api = InProcessApi(app, token)
    run_id = f"inproc-{uuid.uuid4().hex[:8]}"

    async def create(case: str) -> dict[str, Any]:
        status, body = await api.call(
            "POST",
            "/v1/signals",
            {
                "run_id": run_id,
                "test_case": case,
                "recipient": f"user+{run_id}-{case}@example.test",
                "subject_contains": "verify",
                "expires_in_seconds": 600,
            },
        )
        assert status == 201, body
        return dict(body)

    signal_id = (await create("read-me"))["signal_id"]
    for n in range(100):  # warm: imports, pools, prepared statements
        await create(f"warm-{n}")
        await api.call("GET", f"/v1/signals/{signal_id}")
    began, cpu = time.perf_counter(), _cpu()
    for n in range(count):
        if step == "create":
            await create(f"c{n}")
        else:
            status, _ = await api.call("GET", f"/v1/signals/{signal_id}")
            assert status == 200
    per_cpu = (_cpu() - cpu) / count * 1000
    per_wall = (time.perf_counter() - began) / count * 1000
    await asyncio.sleep(1)  # the last first looks
    return per_cpu, per_wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=("create", "read"), default="read")
    parser.add_argument("--count", type=int, default=2000, help="requests measured (2000)")
    args = parser.parse_args()
    with _stack.running_stack(flower=False) as stack:
        for key, value in stack.env.items():
            if key.startswith("SIGNALBOX_"):
                os.environ[key] = value
        os.environ["SIGNALBOX_DATABASE_URL"] = stack.database_url()
        os.environ["SIGNALBOX_BROKER_URL"] = stack.redis_url  # the breakers' Redis
        from app.server import create_app
        from app.settings import get_settings

        app = create_app(get_settings())

        async def run() -> tuple[float, float]:
            async with app.router.lifespan_context(app):
                return await _measure(app, stack.token, args.step, args.count)

        per_cpu, per_wall = asyncio.run(run())
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
    print(f"API in process, no HTTP server: {args.step}, {args.count} requests, one at a time")
    print(f"  CPU of this process per request  {per_cpu:.3f} ms")
    print(f"  wall time per request            {per_wall:.3f} ms")
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
