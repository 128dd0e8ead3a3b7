"""The pod checklist, on separate processes (api, worker, smtp, beat) against
shared servers, for both brokers, Redis and RabbitMQ:

(a) a consumer process killed while it holds a claim: another consumer
    claims once the lease lapses, and consumes;
(b) a worker process killed while a signal waits: a new worker starts and
    the signal is found.

RabbitMQ: SIGNALBOX_TEST_AMQP_URL, else the server on 127.0.0.1:5672
(guest/guest) in a vhost of this test session (`rabbitmqctl add_vhost`), else
its default vhost with our queues purged. No RabbitMQ answering is a failure:
`.ci/run` installs and starts it (`apt-get install rabbitmq-server`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from tests.integration.helpers import create_signal, db_scalar, mail, signal_view
from tests.servers import port_open
from tests.stack import ROOT, Stack, wait_until

pytestmark = pytest.mark.integration

DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672//"
INSTALL_HINT = (
    "RabbitMQ does not answer on {where}: install and start it"
    " (`apt-get install -y rabbitmq-server && rabbitmq-server -detached`, which .ci/run does),"
    " or point SIGNALBOX_TEST_AMQP_URL at one"
)
LEASE_SECONDS = 5

# A consumer as a test suite runs it: the `signalbox` client in its own process.
CONSUMER = """
import sys, time
from signalbox import Signalbox

signal_id, run_id, mode = sys.argv[1:4]
client = Signalbox()
lease = client.claim(signal_id, run_id, lease_seconds=int(sys.argv[4]))
print("claimed", lease.claim.claim_id, flush=True)
if mode == "hold":
    time.sleep(3600)
print("receipt", client.consume(lease.claim.claim_id).receipt_id, flush=True)
"""


def _answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    url = os.environ.get("SIGNALBOX_TEST_AMQP_URL", DEFAULT_AMQP)
    if not _answers(url):
        pytest.fail(INSTALL_HINT.format(where=urlsplit(url).netloc.rpartition("@")[2]))
    rabbitmqctl = shutil.which("rabbitmqctl") or (
        "/usr/sbin/rabbitmqctl" if os.path.exists("/usr/sbin/rabbitmqctl") else None
    )
    if "SIGNALBOX_TEST_AMQP_URL" in os.environ or rabbitmqctl is None:
        yield url
        return
    vhost = f"sbx-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run([rabbitmqctl, "add_vhost", vhost], check=True, capture_output=True, timeout=60)
    subprocess.run(
        [rabbitmqctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    parts = urlsplit(url)
    yield f"{parts.scheme}://{parts.netloc}/{vhost}"
    subprocess.run([rabbitmqctl, "delete_vhost", vhost], capture_output=True, timeout=60)


def _purge(url: str) -> None:
    """Empty our queues (needed only when sharing a vhost with earlier runs)."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        for queue in ("signals", "dead_letter"):
            with contextlib.suppress(Exception):
                channel.queue_purge(queue)


@pytest.fixture(params=["redis", "rabbitmq"])
def pod_stack(request: pytest.FixtureRequest, stack_factory: Callable[..., Stack]) -> Stack:
    extra = {}
    if request.param == "rabbitmq":
        url = request.getfixturevalue("amqp_url")
        _purge(url)
        # Redis stays (the breaker's state); the broker is RabbitMQ.
        extra["SIGNALBOX_BROKER_URL"] = url
    stack = stack_factory(extra)
    stack.spawn("api", ["api"])
    stack.spawn("smtp", ["smtp"])
    stack.spawn("beat", ["beat"])
    stack.spawn_worker(concurrency=1)
    # Four processes start at once: give a busy machine time.
    wait_until(stack.api_ready, 180, interval=0.5, what="the API to answer")
    wait_until(lambda: port_open(stack.smtp_port), 180, interval=0.5, what="the SMTP sink")
    wait_until(lambda: b" ready." in (stack.logs / "worker.log").read_bytes(), 180, 0.5)
    return stack


def readyz(stack: Stack) -> int:
    import httpx

    return httpx.get(f"{stack.api_url}/readyz", timeout=10).status_code


def send(stack: Stack, raw: bytes, to: str) -> None:
    """Stack.send with a patient timeout: four processes share a busy machine."""
    import smtplib

    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=60) as smtp:
        smtp.sendmail("app@example.test", [to], raw)


def consumer(stack: Stack, signal_id: str, run_id: str, mode: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "SIGNALBOX_URL": stack.api_url,
        "SIGNALBOX_TOKEN": stack.token,
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", CONSUMER, signal_id, run_id, mode, str(LEASE_SECONDS)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        assert proc.stderr is not None
        pytest.fail(f"consumer said nothing; stderr: {proc.stderr.read()}")
    return line.strip()


@pytest.mark.timeout(600)
def test_killed_consumer_and_killed_worker_lose_nothing(pod_stack: Stack) -> None:
    stack = pod_stack
    # /readyz probes this broker (a kept connection, Redis PING or an AMQP round trip).
    wait_until(lambda: readyz(stack) == 200, 60, interval=0.5, what="/readyz 200")

    # (a) A consumer dies holding its claim.
    found = create_signal(stack, expires_in_seconds=120)
    send(stack, mail(found["recipient"], run=found["run_id"]), found["recipient"])
    assert signal_view(stack, found["signal_id"], wait=30)["status"] == "found"
    holder = consumer(stack, found["signal_id"], found["run_id"], "hold")
    try:
        assert read_line(holder).startswith("claimed clm_")
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        holder.kill()
        for stream in (holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()

    def second_consumer_succeeds() -> str | None:
        proc = consumer(stack, found["signal_id"], found["run_id"], "consume")
        out, _err = proc.communicate(timeout=60)
        return out if proc.returncode == 0 else None  # refused while the lease holds

    out = wait_until(second_consumer_succeeds, 60, interval=1, what="a claim after the lapse")
    assert "receipt rcp_" in out
    assert signal_view(stack, found["signal_id"])["status"] == "consumed"

    # (b) The worker dies while a signal waits (its checks find nothing yet).
    waiting = create_signal(stack, expires_in_seconds=120)
    wait_until(
        lambda: db_scalar(
            stack, "SELECT count(*) FROM checks WHERE signal_id = %s", waiting["signal_id"]
        ),
        60,
        interval=0.2,
        what="a first check of the waiting signal",
    )
    stack.kill("worker")
    send(stack, mail(waiting["recipient"], run=waiting["run_id"]), waiting["recipient"])
    (stack.logs / "worker.log").rename(stack.logs / "worker.killed.log")
    stack.spawn_worker(concurrency=1)
    wait_until(lambda: b" ready." in (stack.logs / "worker.log").read_bytes(), 180, 0.5)
    view = signal_view(stack, waiting["signal_id"], wait=45)
    assert view["status"] == "found", view
