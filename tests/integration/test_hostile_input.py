"""Hostile input end to end: slow-to-parse mail never stalls the sink, and
content from a subject never leaks into evidence or dead letters."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal as signal_module
import smtplib
import uuid
from pathlib import Path

import pytest

from app.domain.mail import ParsedMail
from app.infra.parse_pool import ParsePool
from tests.hostile_mail import slow_part_lines
from tests.integration.helpers import create_signal, db_rows, mail, wait_result
from tests.stack import SHARED_DOMAIN, Stack, wait_until

pytestmark = pytest.mark.integration


def hostile(cc: str, parts: int = 10_000, subject_kb: int = 400) -> bytes:
    """10,000 flat MIME parts and a 400 KB folded subject; the recipient only in Cc."""
    subject = b"Subject: Your report is ready\r\n" + b"".join(
        b" word%d\r\n" % i for i in range(subject_kb * 1024 // 9)
    )
    body = b"--B\r\nContent-Type: text/plain\r\n\r\nthe first part\r\n" + b"".join(
        b"--B\r\nContent-Type: text/plain\r\n\r\npart %d\r\n" % i for i in range(parts)
    )
    return (
        b"From: app@example.test\r\nTo: list@example.test\r\nCc: " + cc.encode() + b"\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=B\r\n"
        + subject
        + b"\r\n"
        + body
        + b"--B--\r\n"
    )


# A list address every namespace may watch (SIGNALBOX_SHARED_ADDRESSES of the
# test stack): mail delivered only to it is public, so a Cc it names matches.
SHARED_LIST = f"list@{SHARED_DOMAIN}"


def sink_events(stack: Stack) -> list[dict[str, object]]:
    events = []
    for line in stack.log_text("smtp").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def parse_processes(stack: Stack) -> list[int]:
    """The sink's parse pool: the processes it spawned to run ``spawn_main``
    (its resource tracker, also a child, runs something else)."""
    sink = stack.procs["smtp"].pid
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == sink and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_sink_answers_the_next_message_while_hostile_ones_are_parsed(stack: Stack) -> None:
    """Every parser of the sink is stopped (SIGSTOP) while hostile mail and a
    normal message arrive: each is stored and answered all the same, because
    parsing is off the SMTP path. If a 250 waited for a parse, the send would
    time out here, whatever the machine's speed."""
    hostile_signals = [create_signal(stack) for _ in range(4)]
    normal_signal = create_signal(stack, subject_contains="Verify")
    # The pool is started with the sink (two processes); a pool replaced after
    # a parse timeout starts with its first parse.
    stack.send(mail("warm-up@example.test"), ["warm-up@example.test"])
    parsers = wait_until(
        lambda: pids if len(pids := parse_processes(stack)) == 2 else None,
        30,
        what="the sink's two parse processes",
    )
    for pid in parsers:
        os.kill(pid, signal_module.SIGSTOP)
    try:
        with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=20) as smtp:
            for signal in hostile_signals:
                # Envelope to a shared list only (its mail is every namespace's,
                # §11.1): the signal's recipient is known after parsing.
                smtp.sendmail("app@example.test", [SHARED_LIST], hostile(signal["recipient"]))
        stack.send(mail(normal_signal["recipient"]), [normal_signal["recipient"]])
        hostile_ids = {
            r[0]
            for r in db_rows(
                stack,
                "SELECT id FROM sink_messages WHERE %s = ANY(envelope_recipients)",
                SHARED_LIST,
            )
        }
        assert len(hostile_ids) == 4  # stored and answered, none parsed yet
        parsed = {
            e.get("sink_message_id") for e in sink_events(stack) if e.get("event") == "sink_parsed"
        }
        assert not hostile_ids & parsed
    finally:
        for pid in parsers:
            os.kill(pid, signal_module.SIGCONT)

    assert wait_result(stack, normal_signal["signal_id"])["status"] == "found"
    for signal in hostile_signals:  # each matched on its bounded view, via its Cc
        view = wait_result(stack, signal["signal_id"], wait=60)
        assert view["status"] == "found"
        assert view["message"]["subject"].startswith("Your report is ready word0")

    def parsed_all() -> list[dict[str, object]] | None:
        events = sink_events(stack)
        parsed = {e.get("sink_message_id") for e in events if e.get("event") == "sink_parsed"}
        return events if hostile_ids <= parsed else None

    events = wait_until(parsed_all, 30, what="the sink to log every parse")
    bounds = [
        e.get("reason")
        for e in events
        if e.get("event") == "sink_parsed" and e.get("sink_message_id") in hostile_ids
    ]
    assert any("parts" in str(b) for b in bounds)


def test_hostile_message_is_stored_raw_and_its_bounds_are_counted(stack: Stack) -> None:
    signal = create_signal(stack, subject_contains="report is ready")
    raw = hostile(signal["recipient"], parts=12_000)
    stack.send(raw, [signal["recipient"]])
    assert wait_result(stack, signal["signal_id"], wait=60)["status"] == "found"
    stored = db_rows(stack, "SELECT raw FROM sink_messages")
    assert [bytes(r[0]) for r in stored] == [raw]

    def counted() -> dict[str, float]:
        with stack.client() as api:
            text = api.get("/metrics").text
        found = re.findall(r'signalbox_mail_bounds_exceeded_total\{bound="(\w+)"\} (\S+)', text)
        return {bound: float(value) for bound, value in found}

    seen = wait_until(lambda: (c := counted()).get("parts") and c, 20, what="bounds counted")
    assert seen["header_length"] >= 1


def test_a_normal_signal_is_found_while_hostile_mail_floods_the_sink(stack: Stack) -> None:
    normal = create_signal(stack)
    flood = [hostile(f"nobody-{uuid.uuid4().hex[:6]}@example.test") for _ in range(3)]
    with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=30) as smtp:
        for raw in flood:
            smtp.sendmail("app@example.test", ["list@example.test"], raw)
        smtp.sendmail("app@example.test", [normal["recipient"]], mail(normal["recipient"]))
    assert wait_result(stack, normal["signal_id"])["status"] == "found"


def test_parse_pool_gives_up_on_a_parse_past_its_limit_and_recovers() -> None:
    async def go() -> tuple[ParsedMail | None, ParsedMail | None]:
        pool = ParsePool(workers=1, hard_timeout_seconds=0.000_001)
        try:
            await pool.warm()
            stuck = await pool.parse(hostile("cc@example.test"))
            pool.hard_timeout = 120.0  # a fresh pool takes over
            fine = await pool.parse(mail("user@example.test"))
        finally:
            pool.close()
        return stuck, fine

    stuck, fine = asyncio.run(go())
    assert stuck is None
    assert fine is not None and fine.to == ("user@example.test",)


def test_the_sinks_own_looks_parse_in_the_pool_where_the_cpu_budget_applies() -> None:
    """The sink makes its signals' looks in threads beside its event loop,
    where no CPU timer can interrupt a parse: there a hostile message would
    be parsed to the end. The sink's checks parse a message of this size
    (over INLINE_PARSE_BYTES) in its pool instead, where the budget cuts the
    parse short (bound `time`)."""
    from concurrent.futures import ThreadPoolExecutor

    from app.domain.mail import bounds_exceeded
    from app.infra.parse_budget import parse_on_budget
    from app.settings import load_settings
    from app.smtp.server import make_controller

    # Within every bound; 60-140 ms of CPU to parse.
    raw = hostile("cc@example.test", parts=0, subject_kb=1).removesuffix(b"--B--\r\n")
    raw += slow_part_lines(90) + b"--B--\r\n"
    with ThreadPoolExecutor(1) as thread:
        in_a_thread = thread.submit(parse_on_budget, raw, time_budget=0.01).result()
    assert "time" not in bounds_exceeded(in_a_thread)  # the budget could not apply

    controller = make_controller(load_settings())
    try:
        runner = controller.sink.runner
        assert runner is not None
        assert runner.parse == controller.sink.parser.parse_blocking
        controller.sink.parser.budget = 0.005
        with ThreadPoolExecutor(1) as thread:
            in_the_pool = thread.submit(runner.parse, raw).result()
    finally:
        controller.sink.close()
        controller.loop.close()  # never started: close what __init__ opened
    assert "time" in bounds_exceeded(in_the_pool)
    assert in_the_pool.subject.startswith("Your report is ready")


def test_a_look_parses_a_small_message_in_its_own_thread_and_a_larger_one_in_the_pool() -> None:
    """A look's parse of a message of at most INLINE_PARSE_BYTES is made in
    the look's own thread (no pool process is started for it), parsed to the
    end: at that size the bounds keep any parse short. One byte more goes to
    the pool, where the CPU budget cuts a slow parse short."""
    from concurrent.futures import ThreadPoolExecutor

    from app.domain.mail import bounds_exceeded, parse_mail
    from app.infra.parse_pool import INLINE_PARSE_BYTES
    from tests.hostile_mail import HEAD

    def sized(size: int) -> bytes:
        """Slow MIME parts (distinct parameters each) cut to `size` bytes."""
        whole = (
            HEAD
            + b"Subject: many parts\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
            + slow_part_lines(200)
        )
        assert len(whole) > size
        return whole[:size]

    small, large = sized(INLINE_PARSE_BYTES), sized(INLINE_PARSE_BYTES + 1)
    pool = ParsePool(workers=1, budget_seconds=0.001)  # far less than either parse takes
    try:
        with ThreadPoolExecutor(1) as thread:
            here = thread.submit(pool.parse_blocking, small).result()
            assert pool._executor is None  # no process was needed
            there = thread.submit(pool.parse_blocking, large).result()
        assert pool._executor is not None
    finally:
        pool.close()
    assert here == parse_mail(small)
    assert "time" not in bounds_exceeded(here) and here.subject == "many parts"
    assert "time" in bounds_exceeded(there) and there.subject == "many parts"


# --------------------------------------------------------------------------- masking

SECRET_SUBJECT = "Your login code is 739204"


def test_evidence_never_carries_a_code_from_a_subject(stack: Stack) -> None:
    signal = create_signal(stack)
    stack.send(mail(signal["recipient"], subject=SECRET_SUBJECT), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"])
    assert view["status"] == "found"
    # The signal's own view may show its subject...
    assert view["message"]["subject"] == SECRET_SUBJECT
    with stack.client() as api:
        response = api.get(f"/v1/runs/{signal['run_id']}/evidence")
    assert response.status_code == 200
    # ...the evidence, which travels to CI artifacts, never does.
    assert "739204" not in response.text
    (entry,) = response.json()["signals"]
    assert entry["message"]["subject"] == "Your login code is <code>"


def test_dead_letter_near_misses_never_carry_a_code_from_a_subject(stack: Stack) -> None:
    signal = create_signal(stack, subject_contains="Reset your password", expires_in_seconds=3)
    stack.send(mail(signal["recipient"], subject=SECRET_SUBJECT), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"])
    assert view["status"] == "expired"
    dead_letter_id = view["dead_letter"]["dead_letter_id"]
    with stack.client() as api:
        shown = api.get(f"/v1/dead-letters/{dead_letter_id}")
        listed = api.get("/v1/dead-letters", params={"state": "open"})
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence")
    for response in (shown, listed, evidence):
        assert response.status_code == 200
        assert "739204" not in response.text
    near = shown.json()["near_misses"]
    assert [(n["subject"], n["why"]) for n in near] == [
        ("Your login code is <code>", "subject_mismatch")
    ]
    assert "<code>" in shown.json()["recommendation"]
    stored = db_rows(stack, "SELECT near_misses::text FROM dead_letters")
    assert "739204" not in stored[0][0]


def test_dead_letters_stored_before_masking_are_masked_when_read(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=1)
    view = wait_result(stack, signal["signal_id"])
    assert view["status"] == "expired"
    dead_letter_id = view["dead_letter"]["dead_letter_id"]
    # A row as an older version wrote it: the subject as it arrived.
    old = json.dumps(
        [
            {
                "message_id": "msg_old",
                "received_at": "2026-11-29T10:00:00.000Z",
                "subject": SECRET_SUBJECT,
                "why": "subject_mismatch",
            }
        ]
    )
    db_rows(
        stack, "UPDATE dead_letters SET near_misses = %s::jsonb WHERE id = %s", old, dead_letter_id
    )
    with stack.client() as api:
        shown = api.get(f"/v1/dead-letters/{dead_letter_id}")
    assert "739204" not in shown.text
    assert shown.json()["near_misses"][0]["subject"] == "Your login code is <code>"
