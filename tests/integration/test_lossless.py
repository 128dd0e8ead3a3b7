"""Nothing that is there before the deadline is lost, on real services.

Each test attacks one way a mail held by the provider before the deadline
could be missed, or a budget or a namespace could be spent by somebody else.
"""

from __future__ import annotations

import concurrent.futures
import smtplib
import uuid
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from email.utils import format_datetime

import pytest

from tests.integration.helpers import (
    create_signal,
    db_rows,
    db_scalar,
    mail,
    signal_view,
    wait_result,
)
from tests.servers import DovecotServer, MaildevServer
from tests.stack import SHARED_DOMAIN, TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def close_engine() -> None:
    """Close this process's pooled connections now (a test that used the use
    cases in-process must not leave them to the garbage collector)."""
    from app.db.engine import get_engine

    get_engine().dispose()


def count(stack: Stack, sql: str, *params: object) -> int:
    return int(db_scalar(stack, sql, *params))


# --------------------------------------------------------------------------- busy address


def test_a_busy_address_with_hundreds_of_mails_in_the_window_hides_nothing(stack: Stack) -> None:
    """600 other runs' mails to a shared address in the window, then ours:
    one search reads the whole window, page by page."""
    signal = create_signal(stack, expires_in_seconds=120)
    recipient = signal["recipient"]
    others = [mail(recipient, "Other run", run=f"other-{i}") for i in range(600)]
    db_rows(
        stack,
        "INSERT INTO sink_messages (mail_from, envelope_recipients, all_recipients, size, raw)"
        " SELECT 'app@example.test', ARRAY[%s], ARRAY[%s], length(r), r FROM unnest(%s::bytea[]) r",
        recipient,
        recipient,
        others,
    )
    ours = mail(recipient, "Verify", run=signal["run_id"])
    stack.send(ours, [recipient])

    view = wait_result(stack, signal["signal_id"], wait=40)

    assert view["status"] == "found", view
    assert view["message"]["run_marker"] == signal["run_id"]


# --------------------------------------------------------------------------- budget


def test_other_runs_mail_to_a_shared_address_never_spends_the_check_budget(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=120, max_checks=5)
    recipient = signal["recipient"]
    for i in range(8):
        stack.send(mail(recipient, "Other run", run=f"other-{i}"), [recipient])
    wait_until(
        lambda: (
            count(
                stack, "SELECT count(*) FROM near_misses WHERE signal_id = %s", signal["signal_id"]
            )
            == 8
        ),
        40,
        what="eight near misses from the other runs' mail",
    )
    pushes = count(
        stack,
        "SELECT count(*) FROM checks WHERE signal_id = %s AND reason = 'push'",
        signal["signal_id"],
    )
    assert pushes >= 1
    assert (
        count(
            stack,
            "SELECT count(*) FROM checks WHERE signal_id = %s AND reason = 'push' AND counted",
            signal["signal_id"],
        )
        == 0
    )
    assert signal_view(stack, signal["signal_id"])["status"] == "waiting"

    stack.send(mail(recipient, "Verify", run=signal["run_id"]), [recipient])
    view = wait_result(stack, signal["signal_id"], wait=30)

    assert view["status"] == "found"
    counted = count(
        stack, "SELECT count(*) FROM checks WHERE signal_id = %s AND counted", signal["signal_id"]
    )
    assert view["checks"] == counted  # the count reconciles with the rows


# --------------------------------------------------------------------------- namespaces


def test_one_shared_mail_is_matched_once_per_namespace(stack: Stack) -> None:
    """On an address listed in SIGNALBOX_SHARED_ADDRESSES, both namespaces
    wait at once, and each gets the mail (matched per namespace)."""
    recipient = f"qa-{uuid.uuid4().hex[:8]}@{SHARED_DOMAIN}"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    body = {"run_id": run_id, "test_case": "signup", "recipient": recipient}
    with stack.client(TOKENS["default"]) as a, stack.client(TOKENS["other"]) as b:
        sig_a = a.post("/v1/signals", json=body).json()
        sig_b = b.post("/v1/signals", json=body).json()
        stack.send(mail(recipient, "Verify", run=run_id), [recipient])
        view_a = a.get(f"/v1/signals/{sig_a['signal_id']}", params={"wait": 20}).json()
        view_b = b.get(f"/v1/signals/{sig_b['signal_id']}", params={"wait": 20}).json()
        assert view_a["status"] == view_b["status"] == "found"
        assert view_a["message"]["message_id"] == view_b["message"]["message_id"]
        # Neither namespace's signal took the message from the other's.
        assert view_a["dead_letter"] is None and view_b["dead_letter"] is None
        claim_a = a.post(f"/v1/signals/{sig_a['signal_id']}/claim", json={"run_id": run_id})
        claim_b = b.post(f"/v1/signals/{sig_b['signal_id']}/claim", json={"run_id": run_id})
        assert claim_a.status_code == claim_b.status_code == 200
        assert "493817" in claim_a.json()["codes"] and "493817" in claim_b.json()["codes"]


def test_within_a_namespace_one_mail_still_satisfies_only_one_signal(stack: Stack) -> None:
    """Two signals of one namespace and run wait for the same mail: exactly
    one takes it (which one depends on whose check looks first; within one
    batch the earlier signal gets first pick), the other sees it taken."""
    recipient = f"shared-{uuid.uuid4().hex[:8]}@example.test"
    first = create_signal(stack, recipient=recipient, test_case="first")
    second = create_signal(stack, recipient=recipient, test_case="second", run_id=first["run_id"])
    stack.send(mail(recipient, "Verify", run=first["run_id"]), [recipient])

    ids = (first["signal_id"], second["signal_id"])
    wait_until(
        lambda: any(signal_view(stack, i)["status"] == "found" for i in ids),
        30,
        what="one of the two signals to find the mail",
    )
    winner, loser = ids if signal_view(stack, ids[0])["status"] == "found" else ids[::-1]
    wait_until(
        lambda: count(
            stack,
            "SELECT count(*) FROM near_misses"
            " WHERE signal_id = %s AND why = 'taken_by_other_signal'",
            loser,
        ),
        20,
        what="the other signal to see the mail taken",
    )
    assert signal_view(stack, loser)["status"] == "waiting"
    assert signal_view(stack, winner)["status"] == "found"


@pytest.fixture
def isolated_stack(stack_factory: Callable[..., Stack]) -> Iterator[Stack]:
    """The API knows `owned.test` as nobody's and a provider `gone`; the
    processes that check (worker, sink and beat, which make the sink's
    looks) know `owned.test` as namespace default's and have no `gone`: a
    signal created before the ownership (or the removal) was configured."""
    stack = stack_factory()
    data = stack.logs.parent
    (data / "providers.toml").write_text(
        '[providers.gone]\ntype = "maildev"\nurl = "http://127.0.0.1:9"\n'
    )
    (data / "worker-providers.toml").write_text("")
    checking = {
        "SIGNALBOX_NAMESPACE_DOMAINS": "default:owned.test",
        "SIGNALBOX_PROVIDERS_FILE": str(data / "worker-providers.toml"),
    }
    stack.spawn("api", ["api"])
    stack.spawn("smtp", ["smtp"], checking)
    stack.spawn("beat", ["beat"], checking)
    stack.spawn_worker(extra_env=checking)
    stack.wait_api()
    stack.wait_smtp()
    stack.wait_worker()
    yield stack


def test_mail_to_an_owned_address_never_reaches_another_namespace(isolated_stack: Stack) -> None:
    """The intruder's signal was made while the API did not know the domain
    as owned (it even holds the address there); the processes that check
    know it is namespace default's: the mail is default's alone. The mail is
    sent once the signal's first look is written: the API makes that look,
    with the API's stale view of the domain (the case under test is the
    looks made where ownership is known; sent before, the mail could meet
    the stale look first)."""
    stack = isolated_stack
    recipient = f"team-{uuid.uuid4().hex[:8]}@owned.test"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    body = {"run_id": run_id, "test_case": "signup", "recipient": recipient}
    with stack.client(TOKENS["other"]) as intruder:
        theirs = intruder.post(
            "/v1/signals", json={**body, "expires_in_seconds": 3, "max_checks": 50}
        ).json()
        wait_until(
            lambda: count(
                stack, "SELECT count(*) FROM checks WHERE signal_id = %s", theirs["signal_id"]
            ),
            10,
            what="the intruder's first look",
        )
        stack.send(mail(recipient, "Your login code", run=run_id), [recipient])
        view = intruder.get(f"/v1/signals/{theirs['signal_id']}", params={"wait": 20}).json()
    assert view["status"] == "expired", view
    assert view["message"] is None
    assert view["dead_letter"]["near_misses"] == []
    assert "code" not in view["dead_letter"]["recommendation"].lower()
    assert (
        count(stack, "SELECT count(*) FROM near_misses WHERE signal_id = %s", theirs["signal_id"])
        == 0
    )


def test_a_provider_removed_from_the_providers_file_is_a_provider_error_not_a_crash(
    isolated_stack: Stack,
) -> None:
    stack = isolated_stack
    signal = create_signal(stack, provider="gone", expires_in_seconds=120)

    wait_until(
        lambda: signal_view(stack, signal["signal_id"])["last_check"],
        20,
        what="the first check of the removed provider",
    )
    view = signal_view(stack, signal["signal_id"])

    assert view["result"] == "provider_error"
    assert view["last_check"]["error_code"] == "provider_misconfigured"
    assert "KeyError" not in stack.log_text("worker")


# --------------------------------------------------------------------------- whole seconds


@pytest.mark.providers
def test_maildev_mail_stamped_in_the_window_opening_second_is_found(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """MailDev's `time` is the Date header, whole seconds: a mail sent a
    fraction of a second after the signal was created carries a stamp up to
    a second before `received_after`, and must still match."""
    stack = stack_factory()
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )
    stack.start()
    signal = create_signal(stack, provider="catcher", expires_in_seconds=60, max_checks=100)
    created = db_scalar(
        stack, "SELECT received_after FROM signals WHERE id = %s", signal["signal_id"]
    )
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = signal["recipient"]
    msg["Subject"] = "Verify your account"
    msg["Date"] = format_datetime(created.replace(microsecond=0))
    msg.set_content("Your code is 493817")
    with smtplib.SMTP(maildev.host, maildev.smtp_port, timeout=10) as smtp:
        smtp.send_message(msg)

    view = wait_result(stack, signal["signal_id"], wait=40)

    assert view["status"] == "found", view
    assert view["message"]["received_at"] <= signal["received_after"]


@pytest.mark.providers
def test_imap_mail_with_an_internaldate_in_the_window_opening_second_is_found(
    stack_factory: Callable[..., Stack], dovecot: DovecotServer
) -> None:
    """INTERNALDATE has whole seconds: a mail delivered in the same second
    the signal was created, after it, is stamped up to a second earlier."""
    stack = stack_factory({"TEST_IMAP_PASSWORD": dovecot.password})
    (stack.logs.parent / "providers.toml").write_text(
        "[providers.corp-imap]\n"
        'type = "imap"\n'
        f'host = "{dovecot.host}"\n'
        f"port = {dovecot.port}\n"
        "tls = false\n"
        f'username = "{dovecot.username}"\n'
        'password_env = "TEST_IMAP_PASSWORD"\n'
    )
    stack.start()
    signal = create_signal(stack, provider="corp-imap", expires_in_seconds=60, max_checks=100)
    created = db_scalar(
        stack, "SELECT received_after FROM signals WHERE id = %s", signal["signal_id"]
    )
    dovecot.append(mail(signal["recipient"], run=signal["run_id"]), created.replace(microsecond=0))

    view = wait_result(stack, signal["signal_id"], wait=40)

    assert view["status"] == "found", view


# --------------------------------------------------------------------------- claims budget


def test_a_release_spends_its_claim_and_the_last_one_expires_the_signal(stack: Stack) -> None:
    signal = create_signal(stack)
    stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
    sid, run_id = signal["signal_id"], signal["run_id"]
    with stack.client() as api:
        for left in (2, 1, 0):
            claim = api.post(f"/v1/signals/{sid}/claim", json={"run_id": run_id})
            assert claim.status_code == 200, claim.text
            assert claim.json()["claims_left"] == left
            released = api.post(f"/v1/claims/{claim.json()['claim_id']}/release")
            assert released.status_code == 200
        assert released.json()["status"] == "expired"
        assert released.json()["expiry_reason"] == "claims_exhausted"
        fourth = api.post(f"/v1/signals/{sid}/claim", json={"run_id": run_id})
    assert fourth.status_code == 410, fourth.text
    assert fourth.json()["dead_letter"]["reason"] == "claims_exhausted"


# --------------------------------------------------------------------------- late mail


def test_mail_that_arrives_after_the_deadline_is_linked_to_the_dead_letter(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=2)
    expired = wait_result(stack, signal["signal_id"], wait=30)
    assert expired["status"] == "expired" and expired["expiry_reason"] == "deadline"
    dead_letter_id = expired["dead_letter"]["dead_letter_id"]

    stack.send(mail(signal["recipient"], run=signal["run_id"]), [signal["recipient"]])

    def late() -> dict | None:
        with stack.client() as api:
            dl = api.get(f"/v1/dead-letters/{dead_letter_id}").json()
        return dl if dl.get("late_message") else None

    dl = wait_until(late, 30, what="the late message on the dead letter")
    assert dl["late_message"]["seconds_after_deadline"] > 0
    assert "after the deadline" in dl["recommendation"]
    assert "expires_in_seconds" in dl["recommendation"]
    # Linked, not taken: the signal stays expired until somebody redrives it.
    assert signal_view(stack, signal["signal_id"])["status"] == "expired"


def test_mail_between_the_deadline_and_the_expiry_write_is_linked_as_late(stack: Stack) -> None:
    """The expiry is written up to a sweep after the deadline: mail that came
    in between (here: the write made 200 s late) is late mail too."""
    signal = create_signal(stack, expires_in_seconds=2)
    expired = wait_result(stack, signal["signal_id"], wait=30)
    assert expired["status"] == "expired" and expired["expiry_reason"] == "deadline"
    dead_letter_id = expired["dead_letter"]["dead_letter_id"]
    db_rows(
        stack,
        "UPDATE signals SET expired_at = expires_at + interval '200 seconds' WHERE id = %s",
        signal["signal_id"],
    )
    to = signal["recipient"].lower()
    raw = mail(to)
    db_rows(
        stack,
        "INSERT INTO sink_messages"
        " (received_at, mail_from, envelope_recipients, all_recipients, size, raw)"
        " SELECT expires_at + interval '1 second', 'app@example.test', %s, %s, %s, %s"
        " FROM signals WHERE id = %s",
        [to],
        [to],
        len(raw),
        raw,
        signal["signal_id"],
    )

    def late() -> dict | None:
        with stack.client() as api:
            dl = api.get(f"/v1/dead-letters/{dead_letter_id}").json()
        return dl if dl.get("late_message") else None

    dl = wait_until(late, 30, what="the late message on the dead letter")
    assert 0.5 < dl["late_message"]["seconds_after_deadline"] < 2


# --------------------------------------------------------------------------- sweeps


def test_two_sweeps_never_publish_one_dead_letter_twice(stack: Stack) -> None:
    from app.usecases import expiry

    signals = [create_signal(stack, expires_in_seconds=1) for _ in range(6)]
    for s in signals:
        assert wait_result(stack, s["signal_id"], wait=30)["status"] == "expired"
    # As if every creator died before publishing: the outbox holds them all.
    db_rows(stack, "UPDATE dead_letters SET published_at = NULL, publish_attempt_at = NULL")
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            taken = list(pool.map(lambda _: expiry.republish_unsent(), range(4)))
    finally:
        close_engine()
    # The shared beat may have taken some first; together nobody took one twice.
    assert sum(taken) <= len(signals)
    assert count(stack, "SELECT count(*) FROM dead_letters WHERE published_at IS NULL") == 0


def test_every_session_has_a_statement_and_a_lock_timeout(stack: Stack) -> None:
    from sqlalchemy import text

    from app.db.engine import transaction

    try:
        with transaction() as session:
            statement = session.execute(text("SHOW statement_timeout")).scalar_one()
            lock = session.execute(text("SHOW lock_timeout")).scalar_one()
    finally:
        close_engine()
    assert statement == "30s" and lock == "10s"
