"""Diagnosis and triage on the real stack: near misses with several failed
rules, recipient typos, domain typos on create, dead letters grouped by
cause (and acted on by cause), and the console that leads with them."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from tests.integration.helpers import mail
from tests.integration.test_triage_console import csrf_of, sign_in
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def create(stack: Stack, token: str | None = None, **fields: Any) -> dict[str, Any]:
    payload = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": "test_signup",
        "recipient": f"user-{uuid.uuid4().hex[:8]}@example.test",
        "expires_in_seconds": 2,
        **fields,
    }
    with stack.client(token) as api:
        answer = api.post("/v1/signals", json=payload)
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def dead_letter_of(stack: Stack, signal_id: str, token: str | None = None) -> dict[str, Any]:
    def read() -> dict[str, Any] | None:
        with stack.client(token) as api:
            view = api.get(f"/v1/signals/{signal_id}").json()
            if not view.get("dead_letter"):
                return None
            found: dict[str, Any] = api.get(
                f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}"
            ).json()
            return found

    found: dict[str, Any] = wait_until(read, 30, what="the dead letter")
    return found


def test_another_runs_marker_and_another_subject_is_a_near_miss_on_the_marker(
    stack: Stack,
) -> None:
    signal = create(stack, subject_contains="Verify your account")
    to = signal["recipient"]
    stack.send(mail(to, subject="Welcome aboard", run="run-somebody-else"), [to])
    dl = dead_letter_of(stack, signal["signal_id"])
    (near,) = dl["near_misses"]
    assert near["why"] == "run_marker_mismatch"
    assert near["also"] == ["subject_mismatch"]
    assert not dl["recommendation"].startswith("No message to this recipient")
    assert "run-somebody-else" in dl["recommendation"]
    assert "subject_mismatch" in dl["recommendation"]


def test_a_message_to_a_typo_of_the_recipient_is_a_recipient_typo_near_miss(
    stack: Stack,
) -> None:
    domain = f"d{uuid.uuid4().hex[:6]}.test"
    signal = create(stack, recipient=f"new-user@{domain}", subject_contains="Verify")
    typo = f"new-usre@{domain}"
    stack.send(mail(typo, subject="Verify your account", run=signal["run_id"]), [typo])
    # Not a typo: another subject (fails another rule), a far address.
    stack.send(mail(f"new-usr@{domain}", subject="Welcome"), [f"new-usr@{domain}"])
    stack.send(mail(f"someone@{domain}", subject="Verify"), [f"someone@{domain}"])
    dl = dead_letter_of(stack, signal["signal_id"])
    (near,) = dl["near_misses"]
    assert near["why"] == "recipient_typo"
    assert near["address"] == typo
    assert f"'{typo}'" in dl["recommendation"]
    assert f"'new-user@{domain}'" in dl["recommendation"]
    # The run's evidence names neither address, only their hashes.
    with stack.client() as api:
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence").text
    assert typo not in evidence and f"new-user@{domain}" not in evidence
    assert "address_hash" in evidence


def test_mail_another_namespace_holds_is_never_a_typo(stack: Stack) -> None:
    with stack.client(TOKENS["other"]) as api:
        held = api.post("/v1/mailboxes", json={"run_id": "run-o"}).json()["address"]
    local, _, domain = held.partition("@")
    near = f"{local[:-1]}{'x' if local[-1] != 'x' else 'y'}@{domain}"  # one edit from it
    signal = create(stack, recipient=near)
    stack.send(mail(held, run=signal["run_id"]), [held])
    dl = dead_letter_of(stack, signal["signal_id"])
    assert dl["near_misses"] == []
    assert held not in dl["recommendation"]


def test_a_domain_typo_is_warned_about_on_create_and_the_signal_is_made(stack: Stack) -> None:
    warned = create(stack, recipient="qa@gamil.com", expires_in_seconds=60)
    assert warned["warnings"] == [
        {"code": "domain_typo", "field": "recipient", "suggestion": "gmail.com"}
    ]
    assert warned["status"] == "waiting"
    sink = create(stack, recipient="qa@signalbox.tset", expires_in_seconds=60)
    assert sink["warnings"][0]["suggestion"] == "signalbox.test"
    exact = create(stack, recipient="qa@gmail.com", expires_in_seconds=60)
    assert "warnings" not in exact


def _expire_many(stack: Stack, count: int, test_case: str, subject: str | None) -> list[str]:
    """`count` signals of `test_case` that end in the dead-letter queue, each
    with a near miss of another subject when `subject` is given."""
    ids = []
    for _ in range(count):
        signal = create(stack, test_case=test_case, subject_contains="Verify", expires_in_seconds=3)
        if subject is not None:
            stack.send(mail(signal["recipient"], subject=subject), [signal["recipient"]])
        ids.append(signal["signal_id"])
    return ids


def _open_dead_letters(stack: Stack, ids: list[str]) -> bool:
    with stack.client() as api:
        items = api.get("/v1/dead-letters", params={"state": "open", "limit": 500}).json()
    return len({d["signal_id"] for d in items["items"]} & set(ids)) == len(ids)


def test_causes_group_twenty_dead_letters_of_two_causes_largest_first(stack: Stack) -> None:
    subject_ids = _expire_many(stack, 12, "test_signup", "Welcome aboard")
    silent_ids = _expire_many(stack, 8, "test_reset", None)
    wait_until(lambda: _open_dead_letters(stack, subject_ids + silent_ids), 60, what="20 dls")
    with stack.client() as api:
        causes = api.get("/v1/dead-letters/causes").json()["items"]
        later = api.get("/v1/dead-letters/causes", params={"since": "2999-01-01T00:00:00Z"})
        bad_since = api.get("/v1/dead-letters/causes", params={"since": "yesterday"})
    assert [(c["test_case"], c["why"], c["reason"], c["count"]) for c in causes] == [
        ("test_signup", "subject_mismatch", "deadline", 12),
        ("test_reset", "none", "deadline", 8),
    ]
    top = causes[0]
    assert top["provider"] == "sink" and top["first_at"] <= top["last_at"]
    assert top["example"]["dead_letter_id"].startswith("dlq_")
    assert "Welcome aboard" in top["example"]["recommendation"]
    assert later.json()["items"] == []
    assert bad_since.status_code == 422
    # Another namespace sees none of them.
    with stack.client(TOKENS["other"]) as api:
        assert api.get("/v1/dead-letters/causes").json()["items"] == []

    # The console leads with them; its list shows test case, recipient and why.
    with sign_in(stack.api_url, TOKENS["default"]) as console:
        overview = console.get("/console").text
        assert re.search(
            r"12 open dead letters: subject_mismatch in test_signup since \d\d:\d\d", overview
        ), overview
        assert "8 open dead letters: deadline in test_reset since" in overview
        listed = console.get(
            "/console/dead-letters",
            params={"state": "open", "why": "subject_mismatch", "test_case": "test_signup"},
        )
        assert listed.text.count("subject_mismatch</td>") == 12
        assert "test_signup</td>" in listed.text and "test_reset" not in listed.text
        with stack.client() as api:
            recipient = api.get(f"/v1/signals/{subject_ids[0]}").json()["recipient"]
        assert recipient in listed.text
        # Bulk discard by cause, from the console's form.
        done = console.post(
            "/console/dead-letters/discard",
            data={
                "csrf_token": csrf_of(listed.text),
                "state": "open",
                "why": "subject_mismatch",
                "test_case": "test_signup",
                "limit": "500",
                "note": "release 4.2 broke the subject",
            },
        )
        assert done.status_code == 303 and "count=12" in done.headers["location"]

    with stack.client() as api:
        # Bulk redrive by cause through the API.
        redriven = api.post(
            "/v1/dead-letters/redrive",
            json={"filter": {"why": "none", "test_case": "test_reset"}, "limit": 500},
        ).json()
        assert redriven["count"] == 8
        assert api.get("/v1/dead-letters/causes").json()["items"] == []


def test_operators_see_causes_everywhere_but_no_recipient(stack: Stack, ops_stack: Stack) -> None:
    signal = create(stack, test_case="test_ops_view")
    wait_until(lambda: _open_dead_letters(stack, [signal["signal_id"]]), 30, what="dl")
    with ops_stack.client("tok-ops-alice-0123456789") as api:
        causes = api.get("/v1/dead-letters/causes").json()["items"]
        listed = api.get("/v1/dead-letters", params={"state": "open"}).json()["items"]
    assert [c["test_case"] for c in causes] == ["test_ops_view"]
    assert listed and "recipient" not in listed[0] and listed[0]["test_case"] == "test_ops_view"
    with sign_in(ops_stack.api_url, "tok-ops-alice-0123456789") as console:
        page = console.get("/console/dead-letters", params={"state": "open"}).text
    assert "test_ops_view" in page and signal["recipient"] not in page


def test_the_signal_page_shows_every_event_of_its_life_in_order(stack: Stack) -> None:
    signal = create(stack, expires_in_seconds=2)
    dl = dead_letter_of(stack, signal["signal_id"])
    with stack.client() as api:
        assert (
            api.post(f"/v1/dead-letters/{dl['dead_letter_id']}/redrive", json={}).status_code == 200
        )
    to = signal["recipient"]
    stack.send(mail(to), [to])
    with stack.client() as api:
        wait_until(
            lambda: api.get(f"/v1/signals/{signal['signal_id']}").json()["status"] == "found",
            30,
        )
        claim = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        ).json()
        assert api.post(f"/v1/claims/{claim['claim_id']}/release").status_code == 200
        claim = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        ).json()
        assert api.post(f"/v1/claims/{claim['claim_id']}/consume").status_code == 200
    with sign_in(stack.api_url, TOKENS["default"]) as console:
        page = console.get(f"/console/signals/{signal['signal_id']}").text
    life = page[page.index("Life of the signal") :]
    events = re.findall(r'<span class="badge (\w+)">', life.split("Timeline of checks")[0])
    order = [e for e in events if e != "check"]
    assert order == [
        "created",
        "expired",
        "redriven",
        "found",
        "claimed",
        "released",
        "claimed",
        "consumed",
    ], events
    assert "check" in events
    assert dl["dead_letter_id"] in life


def test_near_misses_are_recorded_as_given_and_once(looks: Any) -> None:
    """`near_miss_record_many` stores each miss with its reasons and typo
    address exactly as given (commas, quotes, non-ASCII: they travel as JSON),
    in one statement, and a miss recorded again is not new."""
    from sqlalchemy import text

    from app.db import messages as messages_db
    from app.db.engine import transaction

    signal_id = looks.create(look=False)
    mids = [f"msg_nm{i}" for i in range(3)]
    with transaction() as session:
        for mid in mids:
            session.execute(
                text(
                    "INSERT INTO messages (id, provider, provider_message_id, received_at,"
                    " recipients) VALUES (:id, 'sink', :id, now(), ARRAY['a@example.test'])"
                ),
                {"id": mid},
            )
        new = messages_db.near_miss_record_many(
            session,
            signal_id,
            [
                (mids[0], "subject_mismatch", ["body_mismatch", "run_marker_mismatch"]),
                (mids[1], "recipient_typo", ()),
                (mids[2], "body_mismatch", []),
            ],
            addresses=[None, 'o\'brien,"x"@exämple.test', ""],
        )
        assert new == ["subject_mismatch", "recipient_typo", "body_mismatch"]
        again = messages_db.near_miss_record_many(
            session, signal_id, [(mids[1], "subject_mismatch", ["x"])]
        )
        assert again == []  # already recorded: kept as it was
        rows = session.execute(
            text(
                "SELECT message_id, why, also, address FROM near_misses"
                " WHERE signal_id = :s ORDER BY message_id"
            ),
            {"s": signal_id},
        ).all()
    assert [tuple(r) for r in rows] == [
        (mids[0], "subject_mismatch", ["body_mismatch", "run_marker_mismatch"], None),
        (mids[1], "recipient_typo", [], 'o\'brien,"x"@exämple.test'),
        (mids[2], "body_mismatch", [], None),
    ]
