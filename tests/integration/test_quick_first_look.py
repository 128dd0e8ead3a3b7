"""A new sink signal's first look in one statement when the sink holds no
mail for it (app.usecases.checks.first): it writes what the whole look
writes, and leaves every other case to the whole look, having written
nothing: mail the look could see (in the window, a near miss, a header
recipient), a push or another check that took the signal, a lock held
elsewhere, a deadline passed, a breaker with failures, an expectation. On
the test's own PostgreSQL and Redis, in this process; the race with a real
delivery runs on the whole stack."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import redis
from fastapi.testclient import TestClient
from psycopg.rows import dict_row
from sqlalchemy import event, text
from sqlalchemy.pool import Pool

from app.db import takes as takes_db
from app.db.engine import transaction
from app.domain.ids import new_id
from app.providers.breaker import KEY_PREFIX
from app.server import create_app
from app.settings import get_settings
from app.usecases import signals
from app.usecases.checks import process_runner
from app.usecases.checks.criteria import NEAR_MISS_LOOKBACK
from app.usecases.inputs import SignalCreate
from tests.integration.helpers import create_signal, mail, signal_view
from tests.integration.looks import Looks, sql, store, wal_counted, wal_writes
from tests.stack import TOKENS, Stack

pytestmark = pytest.mark.integration


SIGNAL_COLUMNS = (
    "status, checks_count, consecutive_errors, last_outcome, last_error_code,"
    " next_check_reason, check_fence, check_lease_until, next_check_at - expires_at,"
    " last_look_at IS NOT NULL, last_check_at IS NOT NULL"
)
CHECK_COLUMNS = "generation, fence, provider, reason, outcome, error_code, counted, messages_seen"


def written(signal_id: str) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    (signal,) = sql(f"SELECT {SIGNAL_COLUMNS} FROM signals WHERE id = %s", signal_id)
    checks = sql(f"SELECT {CHECK_COLUMNS} FROM checks WHERE signal_id = %s", signal_id)
    return signal, checks


def test_a_look_with_no_mail_is_one_statement_and_writes_what_the_whole_look_writes(
    looks: Looks,
) -> None:
    whole = looks.create(quick=False)
    quick = looks.create()
    assert looks.quick == {quick: True}
    assert written(quick) == written(whole)
    signal, checks = written(quick)
    assert signal == (
        "waiting",
        1,
        0,
        "no_match",
        None,
        "scheduled",
        1,
        None,
        timedelta(0),
        True,
        True,
    )
    assert checks == [(1, 1, "sink", "first", "no_match", None, True, 0)]
    # The check row and the look agree on when it began; both say it ended after.
    ((same, after, finished),) = sql(
        "SELECT s.last_look_at = c.started_at, s.last_check_at >= s.last_look_at,"
        " c.finished_at >= c.started_at"
        " FROM signals s JOIN checks c ON c.signal_id = s.id WHERE s.id = %s",
        quick,
    )
    assert same and after and finished


def test_the_create_route_makes_the_first_look_in_one_statement(looks: Looks) -> None:
    """`POST /v1/signals` hands the created row to the check runner's
    one-statement look (`app.state.check_runner`), which writes the first
    check: a route that stopped passing it would leave every first look to
    the whole look, and nothing else here would notice."""
    app = create_app(looks.settings)
    app.state.check_runner = looks.runner()  # the real look, its answers kept
    recipient = f"route-{uuid.uuid4().hex[:8]}@example.test"
    headers = {"Authorization": f"Bearer {TOKENS['default']}"}
    with TestClient(app, headers=headers) as client:  # runs the route's background first look
        response = client.post(
            "/v1/signals",
            json={"run_id": "run-route", "test_case": "case-route", "recipient": recipient},
        )
    assert response.status_code == 201, response.text
    signal_id = response.json()["signal_id"]
    assert looks.quick == {signal_id: True}
    assert looks.rows[signal_id]["recipient"] == recipient
    assert [c[3:5] for c in written(signal_id)[1]] == [("first", "no_match")]


def test_the_create_makes_the_first_look_on_its_own_connection(looks: Looks) -> None:
    """The create's use case makes the one-statement look itself, on the one
    connection it checked out, once its create committed: nothing is left
    for after the answer, and no second connection is taken."""
    checkouts: list[object] = []

    def counted(dbapi_connection: object, record: object, proxy: object) -> None:
        checkouts.append(dbapi_connection)

    req = SignalCreate(
        run_id="run-own",
        test_case="case-own",
        recipient=f"own-{uuid.uuid4().hex[:8]}@example.test",
        expires_in_seconds=300,
    )
    runner = looks.runner()
    event.listen(Pool, "checkout", counted)
    try:
        created = signals.signal_create(looks.settings, "default", req, None, runner=runner)
    finally:
        event.remove(Pool, "checkout", counted)
    signal_id = created.view["signal_id"]
    assert created.created and created.first_look is None
    assert looks.quick == {signal_id: True}
    assert [c[3:5] for c in written(signal_id)[1]] == [("first", "no_match")]
    assert len(checkouts) == 1


def test_mail_it_finds_the_next_look_finds_the_mail(looks: Looks) -> None:
    """After a one-statement look, a delivery's push still finds the signal
    (the look left it waiting, its next check at the deadline)."""
    from app.usecases.intake import push

    signal_id = looks.create()
    assert looks.quick[signal_id]
    recipient = looks.rows[signal_id]["recipient"]
    store(recipient)
    push(looks.settings, [], [recipient], runner=process_runner(looks.settings))
    assert sql("SELECT status FROM signals WHERE id = %s", signal_id) == [("found",)]


@pytest.mark.parametrize(
    ("at", "envelope"),
    [
        ("now() + interval '1 second'", True),  # in the window
        ("now() - interval '5 minutes'", True),  # a near miss before it
        ("now() - interval '600 seconds'", True),  # the lookback's first instant
        ("now() + interval '1 second'", False),  # named only in To or Cc
    ],
    ids=["in-window", "near-miss", "lookback-edge", "header-recipient"],
)
def test_mail_the_look_could_see_is_left_to_the_whole_look(
    looks: Looks, at: str, envelope: bool
) -> None:
    recipient = f"q-{uuid.uuid4().hex[:8]}@example.test"
    ((now,),) = sql("SELECT now()")
    store(recipient, at=at.replace("now()", f"'{now.isoformat()}'::timestamptz"), envelope=envelope)
    signal_id = looks.create(recipient=recipient, received_after=now)
    assert looks.quick == {signal_id: False}
    # The whole look was made instead, once.
    assert [c[3] for c in written(signal_id)[1]] == ["first"]
    if at.startswith("now() +") and envelope:
        assert sql("SELECT status FROM signals WHERE id = %s", signal_id) == [("found",)]


@pytest.mark.parametrize(
    "at",
    ["now() - interval '601 seconds'", "now() + interval '1 second'"],
    ids=["before-the-lookback", "another-recipient"],
)
def test_mail_the_look_could_not_see_does_not_stop_it(looks: Looks, at: str) -> None:
    recipient = f"q-{uuid.uuid4().hex[:8]}@example.test"
    ((now,),) = sql("SELECT now()")
    other = at.endswith("'1 second'")
    store(
        f"x-{recipient}" if other else recipient,
        at=at.replace("now()", f"'{now.isoformat()}'::timestamptz"),
    )
    signal_id = looks.create(recipient=recipient, received_after=now)
    assert looks.quick == {signal_id: True}


def _changed(change: str) -> Callable[[str], None]:
    def apply(signal_id: str) -> None:
        sql(f"UPDATE signals SET {change} WHERE id = %s", signal_id)

    return apply


@pytest.mark.parametrize(
    "change",
    [
        # A delivery's push made it due again after the create.
        "next_check_reason = 'push', enqueued_at = clock_timestamp()",
        # Another check took it (its fence moved on).
        "check_fence = check_fence + 1",
        # Under another check's lease.
        "check_lease_until = now() + interval '30 seconds'",
        # Its deadline passed: a final look decides an expiry, written whole.
        "expires_at = now() - interval '1 second'",
    ],
    ids=["pushed", "fence-moved", "leased", "past-deadline"],
)
def test_a_signal_not_as_its_create_left_it_is_not_written(looks: Looks, change: str) -> None:
    signal_id = looks.create(look=False)
    row = created_row(signal_id)
    _changed(change)(signal_id)
    changed = written(signal_id)
    assert not looks.real(row)
    assert written(signal_id) == changed
    assert changed[1] == []


def created_row(signal_id: str) -> Mapping[str, Any]:
    """The signal's row as its create returned it (read before any change)."""
    with psycopg.connect(str(get_settings().database_url), autocommit=True) as conn:
        conn.row_factory = dict_row  # type: ignore[assignment]
        row = conn.execute(
            "SELECT *, clock_timestamp() AS view_now FROM signals WHERE id = %s", (signal_id,)
        ).fetchone()
    assert row is not None and row["check_fence"] == 0
    return row


def test_a_row_locked_elsewhere_is_skipped_not_waited_for(looks: Looks) -> None:
    signal_id = looks.create(look=False)
    row = created_row(signal_id)
    with psycopg.connect(str(get_settings().database_url)) as holder:
        holder.execute("SELECT 1 FROM signals WHERE id = %s FOR UPDATE", (signal_id,))
        began = time.monotonic()
        assert not looks.real(row)
        assert time.monotonic() - began < 5
    assert written(signal_id)[1] == []


def test_a_breaker_with_failures_or_open_is_the_whole_looks_to_judge(looks: Looks) -> None:
    client = redis.Redis.from_url(get_settings().broker_url)
    state, probe = f"{KEY_PREFIX}state:sink", f"{KEY_PREFIX}probe:sink"
    client.hset(state, mapping={"state": "closed", "failures": 2})
    signal_id = looks.create(look=False)
    row = created_row(signal_id)
    assert not looks.real(row)
    # Half-open (open, its time over): the read takes no probe slot, so the
    # whole look that follows is the probe.
    client.hset(state, mapping={"state": "open", "open_until": time.time() - 1})
    assert not looks.real(row)
    assert client.exists(probe) == 0
    assert written(signal_id)[1] == []


@pytest.mark.parametrize("expect", ["exactly_one", "none"])
def test_a_signal_that_expects_more_than_a_first_match_is_looked_at_whole(
    looks: Looks, expect: str
) -> None:
    signal_id = looks.create(expect=expect)
    assert looks.quick == {signal_id: False}
    assert [c[3] for c in written(signal_id)[1]] == ["first"]


def test_a_delivery_racing_the_first_look_is_found_by_its_push(
    stack_factory: Callable[..., Stack],
) -> None:
    """Creates and deliveries to the same address at the same moment, with
    no worker and no beat: only the first look and the delivery's push can
    find the mail. A look that wrote `no_match` over a mail it did not see
    would leave the signal to its deadline, 10 minutes away."""
    stack = stack_factory()
    stack.start(worker=False, beat=False)
    rng = random.Random(23)
    delays = [rng.uniform(0, 0.008) for _ in range(80)]

    def one(delay: float) -> dict[str, Any]:
        recipient = f"race-{uuid.uuid4().hex[:8]}@example.test"
        sent = threading.Thread(
            target=lambda: (time.sleep(delay), stack.send(mail(recipient), [recipient]))
        )
        signal = create_signal(stack, recipient=recipient, expires_in_seconds=600)
        sent.start()
        sent.join()
        return signal_view(stack, signal["signal_id"], wait=20)

    with ThreadPoolExecutor(4) as pool:
        views = list(pool.map(one, delays))
    assert [v["status"] for v in views] == ["found"] * len(delays)
    assert "quick_first_look_failed" not in stack.log_text("api")


def test_the_look_reads_its_recipients_mail_not_every_stored_message(looks: Looks) -> None:
    """A sink that holds many messages to others, and many to this address
    from before the lookback (a shared address): the statement reads the
    address's messages from the index, not every stored message (it did:
    the planner read the table in order, to stop at a first match, 119 ms a
    look at 100,000), and still makes the look."""
    tag = uuid.uuid4().hex[:8]
    recipient = f"q-{tag}@example.test"
    others, old = 3000, 300
    sql(
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw,"
        " received_at) SELECT 'app@example.test', ARRAY[a], ARRAY[a], 1, 'x'::bytea, t"
        " FROM (SELECT format('bulk-%%s-%%s@example.test', %s::text, g) AS a, now() AS t"
        "        FROM generate_series(1, %s) g"
        "       UNION ALL SELECT %s, now() - interval '2 hours' - g * interval '1 second'"
        "        FROM generate_series(1, %s) g) m",
        tag,
        others,
        recipient,
        old,
    )
    sql("ANALYZE sink_messages")  # as autovacuum would: the planner knows the table's size
    signal_id = looks.create(recipient=recipient, look=False)
    row = created_row(signal_id)
    with transaction() as session:
        made = takes_db.signal_first_look_if_empty(
            session,
            signal_id,
            fence=row["check_fence"],
            lookback_seconds=NEAR_MISS_LOOKBACK.total_seconds(),
            counted=True,
            next_check_at=row["expires_at"],
            next_check_reason="scheduled",
            batch_id=new_id("chk"),
        )
        # This transaction's own reads, not yet in pg_stat_user_tables.
        (scanned,) = session.execute(
            text(
                "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables"
                " WHERE relname = 'sink_messages'"
            )
        ).one()
    assert made
    assert scanned < others, f"read {scanned} stored messages in order"
    assert [c[3:5] for c in written(signal_id)[1]] == [("first", "no_match")]


def test_the_creates_look_and_its_read_after_read_the_recipients_mail_only(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same shared sink as above, the first look made by the create's
    own statement and the read after its commit: both read the address's
    messages from the index, not every stored message."""
    tag = uuid.uuid4().hex[:8]
    recipient = f"q-{tag}@example.test"
    sql(
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw,"
        " received_at) SELECT 'app@example.test', ARRAY[a], ARRAY[a], 1, 'x'::bytea, now()"
        " FROM (SELECT format('bulk-%%s-%%s@example.test', %s::text, g) AS a"
        "        FROM generate_series(1, 3000) g) m",
        tag,
    )
    sql("ANALYZE sink_messages")
    scanned: list[int] = []

    @contextlib.contextmanager
    def counted() -> Iterator[Any]:
        # The create and the read after it in one transaction, its reads counted.
        with transaction() as session:
            yield session
            (read,) = session.execute(
                text(
                    "SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables"
                    " WHERE relname = 'sink_messages'"
                )
            ).one()
            scanned.append(int(read))

    monkeypatch.setattr(signals, "autocommit", counted)
    signal_id = looks.create(recipient=recipient)
    assert looks.quick == {signal_id: True}
    assert scanned and scanned[0] < 3000, f"read {scanned} stored messages in order"


def test_mail_stored_after_the_creates_look_and_never_pushed_is_found(
    looks: Looks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create's statement looked and found nothing; mail stored right
    after it, whose push came too early to see the uncommitted signal (here:
    no push at all), is read once the create committed. The signal is made
    due and its whole look finds the mail; without that read it would wait
    for its deadline's look."""
    recipient = f"q-{uuid.uuid4().hex[:8]}@example.test"
    stored: list[str] = []
    read_after = takes_db.signal_due_if_mail

    def delivered_first(*args: Any, **kwargs: Any) -> bool:
        # Between the create's commit and the read after it.
        stored.append(recipient)
        store(recipient)
        return read_after(*args, **kwargs)

    monkeypatch.setattr(takes_db, "signal_due_if_mail", delivered_first)
    signal_id = looks.create(recipient=recipient)
    assert stored and looks.quick == {signal_id: True}
    assert sql("SELECT status FROM signals WHERE id = %s", signal_id) == [("found",)]
    assert [c[3:5] for c in written(signal_id)[1]] == [("first", "no_match"), ("push", "matched")]


def test_a_failed_read_after_the_create_leaves_its_answer_standing(
    looks: Looks, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The create committed and looked; the read after it meets a database
    that went away. The create still answers 201 with its signal (a 503
    would have the caller retry a create that exists), and says why in
    the log."""
    from sqlalchemy.exc import OperationalError

    def away(*args: Any, **kwargs: Any) -> bool:
        raise OperationalError("SELECT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(takes_db, "signal_due_if_mail", away)
    with caplog.at_level("WARNING", logger="signalbox.checks"):
        signal_id = looks.create()
    assert looks.quick == {signal_id: True}
    assert written(signal_id)[0][:4] == ("waiting", 1, 0, "no_match")
    (line,) = [r for r in caplog.records if getattr(r, "event", "") == "quick_first_look_failed"]
    assert line.signal_id == signal_id and line.error == "OperationalError"  # type: ignore[attr-defined]


def test_the_look_commits_without_waiting_for_the_wal_flush(looks: Looks) -> None:
    """Its commit leaves the flush to the WAL writer (a lost look is made
    again, below); a write that must last still flushes on commit."""
    signal_id = looks.create(look=False)
    row = created_row(signal_id)
    with wal_counted() as (session, conn):
        before = wal_writes(conn)
        assert looks.real(row, session)
        assert wal_writes(conn) == before
        conn.execute("UPDATE signals SET updated_at = now() WHERE id = %s", (signal_id,))
        assert wal_writes(conn) == before + 1
    assert [c[3:5] for c in written(signal_id)[1]] == [("first", "no_match")]


def test_a_look_lost_before_the_flush_is_made_again_by_the_sweep(looks: Looks) -> None:
    """What a server crash before the WAL flush leaves: the signal as its
    create committed it, no check row. The sweep makes its first look once
    the look sent with the create is presumed lost."""
    from app.usecases import sweep

    signal_id = looks.create(look=False)
    as_created = written(signal_id)
    assert looks.real(created_row(signal_id))
    assert written(signal_id)[1] != []  # the look was written
    sql(
        "UPDATE signals SET check_fence = 0, checks_count = 0, last_outcome = NULL,"
        " last_check_at = NULL, last_look_at = NULL, consecutive_errors = 0,"
        " next_check_at = created_at, next_check_reason = 'first' WHERE id = %s",
        signal_id,
    )
    sql("DELETE FROM checks WHERE signal_id = %s", signal_id)
    assert written(signal_id) == as_created
    # Its first look was sent with the create (`enqueued_at`): the sweep
    # presumes it lost once SIGNALBOX_REQUEUE_AFTER_SECONDS have passed.
    sql(
        "UPDATE signals SET enqueued_at = enqueued_at - make_interval(secs => %s),"
        " next_check_at = next_check_at - make_interval(secs => %s) WHERE id = %s",
        looks.settings.requeue_after_seconds + 1,
        looks.settings.requeue_after_seconds + 1,
        signal_id,
    )

    sweep.sweep(looks.settings, runner=process_runner(looks.settings))

    signal, checks = written(signal_id)
    assert signal[:4] == ("waiting", 1, 0, "no_match")
    assert [c[4] for c in checks] == ["no_match"]
