"""Creates when PostgreSQL runs out of connections: each answers in the
contract's words (201, 429, or 503 with Retry-After), never 500, and a
create that was refused stored nothing."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.stack import Stack
from tests.stack_fixtures import conninfo_to_url

pytestmark = pytest.mark.integration


def signal_body(run_id: str, test_case: str) -> dict[str, object]:
    return {"run_id": run_id, "test_case": test_case, "recipient": "quota@example.test"}


def limited_role_url(url: str, limit: int) -> str:
    """`url` as a new role that PostgreSQL lets open at most `limit`
    connections: past it, a connect is refused for want of a slot (SQLSTATE
    53300, as when max_connections is reached, without holding hundreds of
    idle backends to get there). Superusers are exempt, so the role is not
    one: it gets the tables, sequences and functions the stack uses."""
    role = f"sbx_limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {int(limit)}")
        conn.execute(f"GRANT ALL ON SCHEMA public TO {role}")
        conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        conn.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}")
    return conninfo_to_url(make_conninfo(url, user=role))


@pytest.mark.timeout(180)
def test_creates_when_postgres_is_out_of_connections_never_answer_500(
    stack_factory: Callable[..., Stack], service_env: dict[str, str]
) -> None:
    """Issue 45's "unexplained 500": PostgreSQL refused the API's pools a
    connection (max_connections reached by the suite's stacks) and the
    create's error went up unhandled. Now each create answers 201 or 429, or
    503 `database_unavailable` with Retry-After when no slot came free."""
    limit = 70
    url = service_env["SIGNALBOX_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    # Room for a few of the 25 clients' units at a time, not for all of them.
    limited = limited_role_url(url, 6)
    stack = stack_factory(
        {"SIGNALBOX_MAX_WAITING_PER_NAMESPACE": str(limit), "SIGNALBOX_DATABASE_URL": limited}
    )
    stack.start_api()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    answers: list[tuple[int, str | None, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(25)

    def create(worker: int) -> None:
        with stack.client() as api:
            barrier.wait()
            for i in range(4):
                try:
                    r = api.post("/v1/signals", json=signal_body(run_id, f"case-{worker}-{i}"))
                except httpx.TransportError as exc:  # the server dropped the connection
                    with lock:
                        answers.append((0, None, type(exc).__name__))
                    continue
                with lock:
                    answers.append((r.status_code, r.headers.get("retry-after"), r.text[:300]))

    threads = [threading.Thread(target=create, args=(w,)) for w in range(25)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(s for s, _, _ in answers)
    assert len(statuses) == 100
    # The test reached PostgreSQL's limit (else it proves nothing).
    assert 503 in statuses, statuses
    unexpected = [a for a in answers if a[0] not in (201, 429, 503)]
    assert not unexpected, (unexpected[:3], stack.log_tail("api", 80))
    assert all(ra is not None and int(ra) >= 1 for s, ra, _ in answers if s in (429, 503))
    assert all('"database_unavailable"' in body for s, _, body in answers if s == 503)
    assert "Exception in ASGI application" not in stack.log_text("api")
    # Every create answered 201 stored its signal, and only those.
    with psycopg.connect(url) as conn:
        stored = conn.execute(
            "SELECT count(*) FROM signals WHERE run_id = %s", (run_id,)
        ).fetchone()
    assert stored is not None and stored[0] == statuses.count(201) <= limit


def _ready(stack: Stack) -> tuple[int, dict[str, object]]:
    r = httpx.get(f"{stack.api_url}/readyz", timeout=10)
    return r.status_code, r.json()


def _until(predicate: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.3)
    return predicate()


@pytest.mark.timeout(180)
def test_readyz_says_so_while_another_client_holds_every_connection(
    stack_factory: Callable[..., Stack], service_env: dict[str, str]
) -> None:
    """Issue 51: another client takes every connection PostgreSQL has left for
    the stack's role. The API still answers from what its pools hold, but
    `/readyz` says PostgreSQL is not ready (503 naming `postgresql`), creates
    answer 201 or 503 with Retry-After (never 500), and once the client lets
    go readiness is back."""
    url = service_env["SIGNALBOX_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
    limited = limited_role_url(url, 12)
    stack = stack_factory({"SIGNALBOX_DATABASE_URL": limited})
    stack.start_api()
    assert _until(lambda: _ready(stack)[0] == 200, 30), _ready(stack)
    held: list[psycopg.Connection[tuple[object, ...]]] = []
    try:
        while len(held) < 12:
            try:
                held.append(psycopg.connect(limited.replace("+psycopg", ""), connect_timeout=5))
            except psycopg.OperationalError:
                break
        assert held, "the role had no slot left to take"
        assert _until(lambda: _ready(stack)[0] == 503, 10), _ready(stack)
        code, body = _ready(stack)
        assert code == 503 and body["failing"] == ["postgresql"], body
        with stack.client() as api:
            answers = [
                api.post("/v1/signals", json=signal_body(f"run-{i}", "exhausted")) for i in range(5)
            ]
        assert all(a.status_code in (201, 503) for a in answers), [a.text for a in answers]
        assert all("retry-after" in a.headers for a in answers if a.status_code == 503)
    finally:
        for conn in held:
            conn.close()
    assert _until(lambda: _ready(stack)[0] == 200, 15), _ready(stack)
