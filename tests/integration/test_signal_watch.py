"""The signal watch core on real PostgreSQL, Redis, SMTP and `celery worker` processes."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from tests.integration.helpers import (
    create_signal,
    db_rows,
    mail,
    signal_view,
    wait_result,
)
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration


def test_email_sent_after_the_signal_is_found(stack: Stack) -> None:
    signal = create_signal(stack, subject_contains="verify")
    assert signal["status"] == "waiting" and signal["result"] == "waiting"
    assert signal["retry_after_seconds"] >= 1

    stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"])

    assert view["status"] == "found"
    assert view["message"]["subject"] == "Verify your account"
    assert view["message"]["run_marker"] == signal["run_id"]
    assert view["message"]["recipient"] == signal["recipient"]
    # The view never carries the content: the code is only given with a claim.
    assert "493817" not in str(view)
    checks = db_rows(stack, "SELECT outcome FROM checks WHERE signal_id = %s", signal["signal_id"])
    assert ("matched",) in checks


def test_message_received_before_window_never_matches(stack: Stack) -> None:
    recipient = f"early-{uuid.uuid4().hex[:6]}@example.test"
    stack.send(mail(recipient), [recipient])
    # Stored (its receipt time taken) before the signal's window opens.
    wait_until(
        lambda: db_rows(
            stack, "SELECT 1 FROM sink_messages WHERE %s = ANY(envelope_recipients)", recipient
        ),
        10,
        what="the message stored",
    )
    signal = create_signal(stack, recipient=recipient, expires_in_seconds=4)

    view = wait_result(stack, signal["signal_id"], wait=15)

    assert view["status"] == "expired"
    assert view["message"] is None
    assert view["dead_letter"]["reason"] == "deadline"
    whys = [n["why"] for n in view["dead_letter"]["near_misses"]]
    assert whys == ["received_before_window"]


def test_message_with_another_runs_marker_never_matches(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=4)
    stack.send(mail(signal["recipient"], run="some-other-run"), [signal["recipient"]])

    view = wait_result(stack, signal["signal_id"], wait=15)

    assert view["status"] == "expired"
    assert view["message"] is None
    assert [n["why"] for n in view["dead_letter"]["near_misses"]] == ["run_marker_mismatch"]
    assert "some-other-run" in view["dead_letter"]["recommendation"]


def test_signal_whose_message_never_comes_expires_at_its_deadline(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=2)

    view = wait_result(stack, signal["signal_id"], wait=15)

    assert view["status"] == "expired" and view["result"] == "expired"
    assert view["expiry_reason"] == "deadline"
    assert view["dead_letter"]["reason"] == "deadline"
    assert view["dead_letter"]["checks"]["total"] >= 1
    dead = db_rows(
        stack, "SELECT count(*) FROM dead_letters WHERE signal_id = %s", signal["signal_id"]
    )
    assert dead == [(1,)]


def test_a_budget_of_one_waits_to_its_deadline_and_spends_its_check_there(stack: Stack) -> None:
    """max_checks 1 (CONTRACT "max_checks"): the sink's first look is free
    and never ends the wait; the one counted look is the deadline's, and a
    mail the sink stored unpushed half a second before it is found there."""
    signal = create_signal(stack, expires_in_seconds=6, max_checks=1)
    sid = signal["signal_id"]
    wait_until(
        lambda: db_rows(stack, "SELECT 1 FROM checks WHERE signal_id = %s", sid),
        10,
        what="the first look",
    )
    view = signal_view(stack, sid)
    assert view["status"] == "waiting" and view["checks"] == 0, view
    data = mail(signal["recipient"])
    db_rows(
        stack,
        "INSERT INTO sink_messages"
        " (received_at, mail_from, envelope_recipients, all_recipients, size, raw)"
        " SELECT expires_at - interval '0.5 seconds', 'app@example.test', %s, %s, %s, %s"
        " FROM signals WHERE id = %s",
        [signal["recipient"].lower()],
        [signal["recipient"].lower()],
        len(data),
        data,
        sid,
    )

    view = wait_result(stack, sid, wait=30)

    assert view["status"] == "found", view
    assert view["checks"] == 1
    counted = db_rows(
        stack,
        "SELECT c.reason, c.counted, c.started_at >= s.expires_at FROM checks c"
        " JOIN signals s ON s.id = c.signal_id WHERE c.signal_id = %s ORDER BY c.fence",
        sid,
    )
    assert counted == [("first", False, False), ("scheduled", True, True)]


def test_a_budget_of_one_ends_by_its_deadline_not_by_its_budget(stack: Stack) -> None:
    """Pushes are free too: a mail to the address that does not match
    before the deadline spends nothing, and the signal ends by deadline."""
    signal = create_signal(stack, expires_in_seconds=5, max_checks=1, subject_contains="never")
    stack.send(mail(signal["recipient"]), [signal["recipient"]])

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert view["status"] == "expired"
    assert view["expiry_reason"] == "deadline"
    assert view["checks"] == 1
    reasons = db_rows(
        stack,
        "SELECT reason, counted FROM checks WHERE signal_id = %s ORDER BY fence",
        signal["signal_id"],
    )
    assert [c for _, c in reasons].count(True) == 1 and reasons[-1][1] is True
    assert any(r == "push" for r, _ in reasons), reasons


def test_the_last_check_of_the_budget_is_kept_for_the_deadline(stack: Stack) -> None:
    """max_checks 2: one check at once, the other at the deadline, where it
    still finds a mail delivered in the window's last second."""
    signal = create_signal(stack, expires_in_seconds=10, max_checks=2)
    sid = signal["signal_id"]
    wait_until(lambda: signal_view(stack, sid)["checks"] == 1, 10, what="first check")
    # No push reaches it: the mail goes straight into the sink's table, as a
    # polled provider would hold it, and only a later look can see it. It is
    # stamped half a second before the deadline by the database's own clock
    # whenever this runs: the sink needs no scheduled look between the first
    # and the final one, so it waits for the deadline's look (asserted below).
    data = mail(signal["recipient"])
    db_rows(
        stack,
        "INSERT INTO sink_messages"
        " (received_at, mail_from, envelope_recipients, all_recipients, size, raw)"
        " SELECT expires_at - interval '0.5 seconds', 'app@example.test', %s, %s, %s, %s"
        " FROM signals WHERE id = %s",
        [signal["recipient"].lower()],
        [signal["recipient"].lower()],
        len(data),
        data,
        sid,
    )

    view = wait_result(stack, sid, wait=30)

    assert view["status"] == "found", view
    assert view["checks"] == 2
    assert view["last_check"]["outcome"] == "matched"
    # The second check of the budget was the deadline's: it began at or after it.
    began_after_deadline = db_rows(
        stack,
        "SELECT c.counted, c.started_at >= s.expires_at FROM checks c"
        " JOIN signals s ON s.id = c.signal_id WHERE c.signal_id = %s ORDER BY c.fence",
        sid,
    )
    assert began_after_deadline == [(True, False), (True, True)]


# The long poll re-reads its signal every app.api.routes.signals.RECHECK_SECONDS
# (5 s) anyway. A poll parked WAKE_PARK_SECONDS before the change would be
# answered by that re-read no sooner than 5 - WAKE_PARK_SECONDS s after it; an
# answer within WAKE_MARGIN_SECONDS of the commit was woken by the notification.
WAKE_PARK_SECONDS = 1.0
WAKE_MARGIN_SECONDS = 3.0


def test_long_poll_wakes_when_the_signal_changes(stack: Stack) -> None:
    """A parked long poll is answered as soon as its signal stops waiting,
    whichever process changed it: the notification wakes it, well before its
    periodic re-read."""
    signal = create_signal(stack, expires_in_seconds=120)
    answered: list[tuple[float, dict]] = []

    def long_poll() -> None:
        view = wait_result(stack, signal["signal_id"], wait=30)
        answered.append((time.monotonic(), view))

    poll = threading.Thread(target=long_poll)
    poll.start()
    time.sleep(WAKE_PARK_SECONDS)  # the long poll is parked
    # Any change of the row, from any process, must wake it: change it here.
    db_rows(stack, "UPDATE signals SET status = 'expired' WHERE id = %s", signal["signal_id"])
    # Committed when db_rows returns: the time to the answer counts from here,
    # not from before a new connection that a loaded machine may make slowly.
    changed_at = time.monotonic()
    poll.join(timeout=35)

    ((done_at, view),) = answered
    assert view["status"] == "expired"
    assert done_at - changed_at < WAKE_MARGIN_SECONDS


def test_long_poll_woken_by_a_found_signal_answers_from_the_notification(stack: Stack) -> None:
    """A long poll woken because its signal was found answers with the view
    the notification carried, without reading the signal again. Shown by a
    transaction that ends the wait (checks 7) and changes the row once more
    before it commits (checks 9): the notification holds the row as the
    statement that ended the wait left it, a read would give the last."""
    signal = create_signal(stack, expires_in_seconds=120)
    answered: list[dict] = []
    poll = threading.Thread(
        target=lambda: answered.append(wait_result(stack, signal["signal_id"], wait=30))
    )
    poll.start()
    # Parked: had its first read come after the commit, it would answer 9
    # as a re-read would. More than the wake test's park, on a loaded machine.
    time.sleep(3 * WAKE_PARK_SECONDS)
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:  # one transaction
        conn.execute(
            "UPDATE signals SET status = 'found', checks_count = 7, found_at = now() WHERE id = %s",
            [signal["signal_id"]],
        )
        conn.execute("UPDATE signals SET checks_count = 9 WHERE id = %s", [signal["signal_id"]])
    poll.join(timeout=35)

    (view,) = answered
    assert view["status"] == "found" and view["checks"] == 7
    assert signal_view(stack, signal["signal_id"])["checks"] == 9


def test_long_poll_returns_the_current_view_after_the_wait(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=60)
    started = time.monotonic()
    view = wait_result(stack, signal["signal_id"], wait=1)
    assert time.monotonic() - started >= 0.9
    assert view["result"] == "waiting"
    assert view["retry_after_seconds"] >= 1


def test_list_signals_of_a_run_pages_with_a_cursor(stack: Stack) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ids = [
        create_signal(stack, run_id=run_id, test_case=f"case-{i}")["signal_id"] for i in range(3)
    ]
    with stack.client() as api:
        first = api.get("/v1/signals", params={"run_id": run_id, "limit": 2}).json()
        second = api.get(
            "/v1/signals", params={"run_id": run_id, "limit": 2, "cursor": first["next_cursor"]}
        ).json()
    assert [s["signal_id"] for s in first["items"] + second["items"]] == ids
    assert second["next_cursor"] is None


def test_mailbox_gives_a_fresh_address_that_receives(stack: Stack) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with stack.client() as api:
        box = api.post("/v1/mailboxes", json={"run_id": run_id}).json()
        other = api.post("/v1/mailboxes", json={"run_id": run_id}).json()
    assert box["mailbox_id"].startswith("mbx_") and box["address"] != other["address"]
    signal = create_signal(stack, run_id=run_id, recipient=box["address"])
    stack.send(mail(box["address"]), [box["address"]])
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
