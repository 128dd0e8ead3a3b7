"""Assertions on the real stack: `expect` none and exactly_one, a signal's
matches, and the claim's owner (docs/api.md, "Assertions")."""

from __future__ import annotations

import smtplib
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

import pytest

from tests.integration.helpers import create_signal, db_rows, db_scalar, mail, wait_result
from tests.integration.test_triage_console import sign_in
from tests.servers import MaildevServer
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def checks_of(stack: Stack, signal_id: str) -> list[dict[str, Any]]:
    with stack.client() as api:
        response = api.get(f"/v1/signals/{signal_id}/checks", params={"limit": 500})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def matches_of(stack: Stack, signal_id: str, token: str | None = None) -> Any:
    with stack.client(token) as api:
        return api.get(f"/v1/signals/{signal_id}/matches")


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def dead_letter_count(stack: Stack, signal_id: str) -> int:
    sql = "SELECT count(*) FROM dead_letters WHERE signal_id = %s"
    return int(db_scalar(stack, sql, signal_id))


def first_look(stack: Stack, signal_id: str) -> None:
    """Until the signal's first look was made (what comes next is a push's)."""
    wait_until(
        lambda: wait_result(stack, signal_id, wait=0)["last_check"],
        timeout=30,
        what=f"the first look of {signal_id}",
    )


def claim(stack: Stack, view: dict[str, Any], **body: Any) -> Any:
    with stack.client() as api:
        return api.post(
            f"/v1/signals/{view['signal_id']}/claim", json={"run_id": view["run_id"], **body}
        )


# --------------------------------------------------------------------------- expect none


def test_none_is_absent_only_after_a_final_look_at_or_after_the_deadline(stack: Stack) -> None:
    signal = create_signal(
        stack, expect="none", subject_contains="Reset your password", expires_in_seconds=3
    )
    assert signal["expect"] == "none" and signal["settle_seconds"] is None
    # Mail to the recipient that does not match is no arrival.
    stack.send(mail(signal["recipient"], "Welcome aboard"), [signal["recipient"]])

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert (view["status"], view["result"]) == ("absent", "absent"), view
    assert view["dead_letter"] is None and view["message"] is None
    deciding = checks_of(stack, signal["signal_id"])[-1]
    assert deciding["outcome"] == "no_match"
    assert at(deciding["started_at"]) >= at(view["expires_at"])
    assert dead_letter_count(stack, signal["signal_id"]) == 0
    with stack.client() as api:
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence").json()
    (entry,) = evidence["signals"]
    assert entry["status"] == "absent"
    assert entry["expectation"]["held"] is True
    assert at(entry["expectation"]["final_look_at"]) >= at(view["expires_at"])
    refused = claim(stack, view)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "not_claimable"


def test_none_is_arrived_at_once_by_the_delivery_that_brings_a_match(stack: Stack) -> None:
    signal = create_signal(stack, expect="none", expires_in_seconds=120)
    recipient = signal["recipient"]
    first_look(stack, signal["signal_id"])
    stack.send(mail(recipient, "Reset your password", run=signal["run_id"]), [recipient])

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert (view["status"], view["result"]) == ("arrived", "arrived"), view
    assert view["message"]["subject"] == "Reset your password"
    assert "none was expected" in view["recommendation"]
    # Decided by the check the delivery pushed, long before the deadline.
    deciding = checks_of(stack, signal["signal_id"])[-1]
    assert (deciding["reason"], deciding["outcome"]) == ("push", "matched")
    assert db_scalar(
        stack, "SELECT expires_at > now() FROM signals WHERE id = %s", signal["signal_id"]
    )
    assert dead_letter_count(stack, signal["signal_id"]) == 0
    refused = claim(stack, view)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "not_claimable"


def test_an_arrived_signal_takes_nothing_from_a_signal_that_waits_for_the_mail(
    stack: Stack,
) -> None:
    """The none signal was first, but only shows the message: the first
    signal still gets it, and the matches name it as the taker."""
    none = create_signal(stack, expect="none", expires_in_seconds=120)
    recipient = none["recipient"]
    stack.send(mail(recipient), [recipient])
    assert wait_result(stack, none["signal_id"], wait=30)["status"] == "arrived"
    first = create_signal(
        stack, recipient=recipient, received_after=none["received_after"], expires_in_seconds=60
    )

    found = wait_result(stack, first["signal_id"], wait=30)

    assert found["status"] == "found", found
    arrived = wait_result(stack, none["signal_id"])
    assert found["message"]["message_id"] == arrived["message"]["message_id"]
    items = matches_of(stack, none["signal_id"]).json()["items"]
    assert [(i["message_id"], i["taken_by"]) for i in items] == [
        (found["message"]["message_id"], first["signal_id"])
    ]


def test_the_sweep_makes_absent_a_none_signal_whose_final_look_found_nothing(
    stack: Stack,
) -> None:
    """The safety net: a `none` signal past its deadline whose last look
    began after it and found nothing is `absent`, never a dead letter."""
    signal = create_signal(stack, expect="none", expires_in_seconds=600)
    first_look(stack, signal["signal_id"])
    db_rows(
        stack,
        "UPDATE signals SET expires_at = now() - interval '2 seconds',"
        " last_look_at = now() - interval '1 second', last_outcome = 'no_match',"
        " next_check_at = now() + interval '1 hour' WHERE id = %s",
        signal["signal_id"],
    )

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert view["status"] == "absent", view
    assert dead_letter_count(stack, signal["signal_id"]) == 0


def test_a_none_signal_whose_final_look_never_saw_the_provider_is_never_absent(
    stack: Stack,
) -> None:
    """Past its deadline with no look begun after it (and the grace gone):
    the expectation could not be checked, so it expires with a dead letter."""
    signal = create_signal(stack, expect="none", expires_in_seconds=600)
    first_look(stack, signal["signal_id"])
    db_rows(
        stack,
        "UPDATE signals SET expires_at = now() - interval '1 hour',"
        " last_look_at = now() - interval '2 hours', next_check_at = now() + interval '1 hour'"
        " WHERE id = %s",
        signal["signal_id"],
    )

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert (view["status"], view["expiry_reason"]) == ("expired", "deadline"), view
    assert dead_letter_count(stack, signal["signal_id"]) == 1


@pytest.mark.providers
def test_none_on_maildev_decides_on_the_look_at_the_deadline_whatever_its_whole_seconds(
    stack_factory: Callable[..., Stack], maildev: MaildevServer
) -> None:
    """MailDev is polled and stamps whole seconds (the Date header). A quiet
    address is `absent` only after a look begun at or after the deadline;
    with a budget of two looks the second is kept for the deadline, and a
    mail that came after the first look is seen by that last look (`arrived`)."""
    stack = stack_factory()
    (stack.logs.parent / "providers.toml").write_text(
        f'[providers.catcher]\ntype = "maildev"\nurl = "{maildev.url}"\n'
    )
    stack.start()
    common = {"provider": "catcher", "expect": "none"}
    quiet = create_signal(stack, expires_in_seconds=4, **common)
    # Its deadline 6 s after the other's: no look of the other rides along early.
    late = create_signal(stack, expires_in_seconds=10, max_checks=2, **common)
    # One look of the budget spent: the other is the deadline's.
    wait_until(
        lambda: wait_result(stack, late["signal_id"], wait=0)["checks"] == 1,
        timeout=30,
        what="the first counted look",
    )
    for to in (late["recipient"], f"someone-else-{uuid.uuid4().hex[:6]}@example.test"):
        msg = EmailMessage()
        msg["From"] = "app@example.test"
        msg["To"] = to
        msg["Subject"] = "Your account was deleted"
        msg["Date"] = format_datetime(datetime.now(UTC).replace(microsecond=0))
        msg.set_content("Goodbye.")
        with smtplib.SMTP(maildev.host, maildev.smtp_port, timeout=10) as smtp:
            smtp.send_message(msg)

    absent = wait_result(stack, quiet["signal_id"], wait=40)
    arrived = wait_result(stack, late["signal_id"], wait=40)

    assert absent["status"] == "absent", absent
    deciding = checks_of(stack, quiet["signal_id"])[-1]
    assert deciding["outcome"] == "no_match"
    assert at(deciding["started_at"]) >= at(absent["expires_at"])
    assert arrived["status"] == "arrived", arrived
    looks = [c for c in checks_of(stack, late["signal_id"]) if c["outcome"] != "circuit_open"]
    assert [c["outcome"] for c in looks] == ["no_match", "matched"]
    assert at(looks[-1]["started_at"]) >= at(arrived["expires_at"])
    assert at(arrived["message"]["received_at"]) <= at(arrived["expires_at"])


# --------------------------------------------------------------------------- exactly one


def test_exactly_one_is_found_once_the_settle_time_passed_without_a_second(stack: Stack) -> None:
    signal = create_signal(stack, expect="exactly_one", settle_seconds=4, expires_in_seconds=60)
    assert signal["settle_seconds"] == 4
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    settling = wait_result(stack, signal["signal_id"], wait=0)
    assert settling["status"] == "waiting", settling

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert view["status"] == "found", view
    received = at(view["message"]["received_at"])
    deciding = checks_of(stack, signal["signal_id"])[-1]
    assert deciding["outcome"] == "matched"
    assert (at(deciding["started_at"]) - received).total_seconds() >= 4
    assert claim(stack, view).status_code == 200


def test_two_mails_a_fraction_of_a_second_apart_are_duplicate_messages(stack: Stack) -> None:
    signal = create_signal(stack, expect="exactly_one", expires_in_seconds=60)
    assert signal["settle_seconds"] == 5
    recipient = signal["recipient"]
    stack.send(mail(recipient), [recipient])
    time.sleep(0.3)
    stack.send(mail(recipient), [recipient])

    view = wait_result(stack, signal["signal_id"], wait=30)

    assert (view["status"], view["expiry_reason"]) == ("expired", "duplicate_messages"), view
    ids = [i["message_id"] for i in matches_of(stack, signal["signal_id"]).json()["items"]]
    assert len(ids) == 2
    with stack.client() as api:
        dead = api.get(f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}").json()
    assert dead["reason"] == "duplicate_messages"
    assert [m["message_id"] for m in dead["duplicates"]["messages"]] == ids
    assert 0.3 <= dead["duplicates"]["seconds_apart"] < 5
    assert "twice" in dead["recommendation"]


# --------------------------------------------------------------------------- create


def test_expect_and_settle_seconds_are_part_of_the_idempotency_comparison(stack: Stack) -> None:
    base = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": "test_once",
        "recipient": f"u-{uuid.uuid4().hex[:6]}@example.test",
    }

    def post(**fields: Any) -> Any:
        with stack.client() as api:
            return api.post("/v1/signals", json={**base, **fields})

    assert post(expect="exactly_one").status_code == 201
    assert post(expect="exactly_one", settle_seconds=5).status_code == 202  # the default
    for differing in ({}, {"expect": "none"}, {"expect": "exactly_one", "settle_seconds": 6}):
        response = post(**differing)
        assert response.status_code == 409, (differing, response.text)
        assert response.json()["error"]["code"] == "idempotency_conflict"
    assert int(db_scalar(stack, "SELECT count(*) FROM signals")) == 1


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"expect": "some"}, "expect"),
        ({"expect": None}, "expect"),
        ({"expect": "exactly_one", "settle_seconds": 0}, "settle_seconds"),
        ({"expect": "exactly_one", "settle_seconds": 301}, "settle_seconds"),
        ({"expect": "exactly_one", "settle_seconds": "5s"}, "settle_seconds"),
        ({"settle_seconds": 5}, "settle_seconds"),
        ({"expect": "none", "settle_seconds": 5}, "settle_seconds"),
    ],
)
def test_bad_expect_or_settle_is_422_naming_the_field_and_stores_nothing(
    stack: Stack, fields: dict[str, Any], field: str
) -> None:
    with stack.client() as api:
        response = api.post(
            "/v1/signals",
            json={"run_id": "r1", "test_case": "t", "recipient": "a@example.test", **fields},
        )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert int(db_scalar(stack, "SELECT count(*) FROM signals")) == 0


# --------------------------------------------------------------------------- matches


def test_matches_are_every_matching_message_oldest_first_with_its_taker(stack: Stack) -> None:
    signal = create_signal(stack, subject_contains="Verify", expires_in_seconds=60)
    recipient = signal["recipient"]
    stack.send(mail(recipient, "Verify your account"), [recipient])
    found = wait_result(stack, signal["signal_id"], wait=30)
    assert found["status"] == "found", found
    stack.send(mail(recipient, "Welcome"), [recipient])  # not a match
    stack.send(mail(recipient, "Verify again", run="another-run"), [recipient])  # not a match
    stack.send(mail(recipient, "Please verify your account"), [recipient])
    # A look records the window: a second signal on the address makes one.
    second = create_signal(
        stack,
        recipient=recipient,
        subject_contains="nothing like it",
        received_after=signal["received_after"],
        expires_in_seconds=60,
    )
    first_look(stack, second["signal_id"])

    response = matches_of(stack, signal["signal_id"])

    assert response.status_code == 200, response.text
    items = response.json()["items"]
    assert [(i["subject"], i["taken_by"]) for i in items] == [
        ("Verify your account", signal["signal_id"]),
        ("Please verify your account", None),
    ]
    assert items[0]["message_id"] == found["message"]["message_id"]
    assert items[0]["received_at"] < items[1]["received_at"]
    assert matches_of(stack, signal["signal_id"], TOKENS["other"]).status_code == 404


def test_matches_filter_on_the_body_when_the_signal_does(stack: Stack) -> None:
    signal = create_signal(stack, body_contains="code is 493817", expires_in_seconds=60)
    recipient = signal["recipient"]
    first_look(stack, signal["signal_id"])
    stack.send(mail(recipient, "Other", body="Your code is 111111"), [recipient])
    stack.send(mail(recipient, "Verify", body="Your code is 493817"), [recipient])
    found = wait_result(stack, signal["signal_id"], wait=30)
    assert found["status"] == "found", found

    items = matches_of(stack, signal["signal_id"]).json()["items"]

    assert [(i["subject"], i["taken_by"]) for i in items] == [("Verify", signal["signal_id"])]


# --------------------------------------------------------------------------- owner


def test_the_claims_owner_is_recorded_and_shown_wherever_the_claim_is(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=60)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"], wait=30)
    assert view["status"] == "found", view

    taken = claim(stack, view, owner="pod-7")

    assert taken.status_code == 200, taken.text
    assert taken.json()["owner"] == "pod-7"
    refused = claim(stack, view, owner="pod-8")
    assert refused.status_code == 409
    assert (refused.json()["status"], refused.json()["owner"]) == ("already_claimed", "pod-7")
    claim_id = taken.json()["claim_id"]
    with stack.client() as api:
        assert api.get(f"/v1/claims/{claim_id}").json()["owner"] == "pod-7"
        assert api.get(f"/v1/signals/{view['signal_id']}").json()["claim"]["owner"] == "pod-7"
        assert api.post(f"/v1/claims/{claim_id}/extend", json={}).json()["owner"] == "pod-7"
    with sign_in(stack.api_url, TOKENS["default"]) as console:
        page = console.get(f"/console/signals/{view['signal_id']}")
    assert "held by pod-7" in page.text
    with stack.client() as api:
        receipt = api.post(f"/v1/claims/{claim_id}/consume").json()
        ended = api.get(f"/v1/claims/{claim_id}")
    assert receipt["owner"] == "pod-7"
    assert ended.status_code == 410 and ended.json()["owner"] == "pod-7"
    assert db_rows(stack, "SELECT owner FROM receipts") == [("pod-7",)]


def test_a_claim_without_an_owner_is_held_by_the_tokens_name(stack: Stack) -> None:
    signal = create_signal(stack, expires_in_seconds=60)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"], wait=30)

    taken = claim(stack, view)

    assert taken.status_code == 200 and taken.json()["owner"] == "default"


@pytest.mark.parametrize("owner", ["", "x" * 201, "pod\x00"])
def test_a_bad_owner_is_422_and_claims_nothing(stack: Stack, owner: str) -> None:
    signal = create_signal(stack, expires_in_seconds=60)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    view = wait_result(stack, signal["signal_id"], wait=30)

    response = claim(stack, view, owner=owner)

    assert response.status_code == 422 and response.json()["error"]["field"] == "owner"
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
