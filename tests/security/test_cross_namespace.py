"""Tenants against each other, and operators against content, on every route.

Namespace A ("default") builds a run with a found and claimed signal, a dead
letter and a mailbox; namespace B ("other") and an operator then try every
route on A's objects.
"""

from __future__ import annotations

import smtplib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.integration.helpers import mail
from tests.security.conftest import OPS_TOKEN, TOKEN_A, TOKEN_B
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

SUBJECT = "Welcome aboard, your code is 583920"


@dataclass
class World:
    run_id: str
    marker: str
    signal_id: str
    message_id: str
    claim_id: str
    dead_letter_id: str
    mailbox_id: str
    mailbox_address: str
    # Everything B was answered, to search for A's secrets.
    seen_by_b: list[str] = field(default_factory=list)


def client(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


@pytest.fixture(scope="module")
def world(tenancy_stack: Stack) -> Iterator[World]:
    stack = tenancy_stack
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    marker = run_id
    recipient = f"qa-{uuid.uuid4().hex[:6]}@team-a.test"
    with client(stack, TOKEN_A) as a:
        mailbox = a.post("/v1/mailboxes", json={"run_id": run_id}).json()
        found = a.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "found",
                "recipient": recipient,
                "subject_contains": "Welcome",
                "require_run_marker": True,
            },
        ).json()
        # A patient client: on a loaded machine the sink may take a while to answer.
        with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=90) as smtp:
            smtp.sendmail("app@example.test", [recipient], mail(recipient, SUBJECT, run=marker))
        view = a.get(f"/v1/signals/{found['signal_id']}", params={"wait": 30}).json()
        assert view["status"] == "found", view
        claim = a.post(
            f"/v1/signals/{found['signal_id']}/claim", json={"run_id": run_id, "lease_seconds": 900}
        ).json()
        assert claim["status"] == "claimed", claim
        doomed = a.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "doomed",
                "recipient": f"nobody-{uuid.uuid4().hex[:6]}@team-a.test",
                "expires_in_seconds": 1,
                "max_checks": 1,
            },
        ).json()

        def dead_letter() -> str | None:
            v = a.get(f"/v1/signals/{doomed['signal_id']}", params={"wait": 5}).json()
            return v["dead_letter"]["dead_letter_id"] if v.get("dead_letter") else None

        dead_letter_id = wait_until(dead_letter, 60, what="A's dead letter")
    yield World(
        run_id=run_id,
        marker=marker,
        signal_id=found["signal_id"],
        message_id=view["message"]["message_id"],
        claim_id=claim["claim_id"],
        dead_letter_id=dead_letter_id,
        mailbox_id=mailbox["mailbox_id"],
        mailbox_address=mailbox["address"],
    )


def b_attempts(w: World) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every route B could aim at A's objects (method, path, body)."""
    return [
        ("GET", f"/v1/signals/{w.signal_id}", None),
        ("GET", f"/v1/signals/{w.signal_id}?wait=1", None),
        ("POST", f"/v1/signals/{w.signal_id}/claim", {"run_id": w.run_id}),
        ("POST", f"/v1/claims/{w.claim_id}/consume", None),
        ("POST", f"/v1/claims/{w.claim_id}/release", None),
        ("POST", f"/v1/claims/{w.claim_id}/extend", {"lease_seconds": 60}),
        ("GET", f"/v1/dead-letters/{w.dead_letter_id}", None),
        ("POST", f"/v1/dead-letters/{w.dead_letter_id}/redrive", {}),
        ("POST", f"/v1/dead-letters/{w.dead_letter_id}/discard", {"note": "not mine"}),
        ("DELETE", f"/v1/mailboxes/{w.mailbox_id}", None),
        ("GET", f"/v1/runs/{w.run_id}/evidence", None),
    ]


def test_namespace_b_gets_404_on_every_object_of_namespace_a(
    tenancy_stack: Stack, world: World
) -> None:
    with client(tenancy_stack, TOKEN_B) as b:
        for method, path, body in b_attempts(world):
            r = b.request(method, path, json=body)
            world.seen_by_b.append(r.text)
            assert r.status_code == 404, (method, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "not_found"


def test_namespace_b_lists_nothing_of_namespace_a(tenancy_stack: Stack, world: World) -> None:
    with client(tenancy_stack, TOKEN_B) as b:
        signals = b.get("/v1/signals", params={"run_id": world.run_id})
        # A tenant's `?namespace=` is ignored: it only ever sees its own.
        filtered = b.get("/v1/signals", params={"run_id": world.run_id, "namespace": "default"})
        dead = b.get("/v1/dead-letters", params={"namespace": "default"})
    for r in (signals, filtered, dead):
        world.seen_by_b.append(r.text)
        assert r.status_code == 200
        assert r.json()["items"] == []


def test_a_objects_are_untouched_after_b_tried_everything(
    tenancy_stack: Stack, world: World
) -> None:
    with client(tenancy_stack, TOKEN_A) as a:
        view = a.get(f"/v1/signals/{world.signal_id}").json()
        dead = a.get(f"/v1/dead-letters/{world.dead_letter_id}").json()
    assert view["status"] == "claimed"
    assert view["claim"]["claim_id"] == world.claim_id
    assert view["message"]["subject"] == SUBJECT  # its own namespace sees the subject
    assert dead["state"] == "open"


def test_b_may_not_wait_on_a_mailbox_address_or_an_owned_domain_of_a(
    tenancy_stack: Stack, world: World
) -> None:
    with client(tenancy_stack, TOKEN_B) as b:
        for recipient in (
            world.mailbox_address,
            world.mailbox_address.upper(),
            f"anyone-{uuid.uuid4().hex[:6]}@team-a.test",
            f"anyone-{uuid.uuid4().hex[:6]}@TEAM-A.test",
        ):
            r = b.post(
                "/v1/signals",
                json={"run_id": "run-b", "test_case": recipient, "recipient": recipient},
            )
            world.seen_by_b.append(r.text)
            assert r.status_code == 403, (recipient, r.text)
            assert r.json()["error"]["code"] == "recipient_not_owned"
        own = b.post(
            "/v1/signals",
            json={"run_id": "run-b", "test_case": "own", "recipient": "qa@team-b.test"},
        )
        shared = b.post(
            "/v1/signals",
            json={"run_id": "run-b", "test_case": "shared", "recipient": "qa@shared.test"},
        )
    assert own.status_code == 201, own.text
    assert shared.status_code == 201, shared.text


def test_a_deleted_mailbox_keeps_its_owner(tenancy_stack: Stack) -> None:
    with client(tenancy_stack, TOKEN_A) as a:
        mailbox = a.post("/v1/mailboxes", json={"run_id": "run-del"}).json()
        assert a.delete(f"/v1/mailboxes/{mailbox['mailbox_id']}").status_code == 204
    with client(tenancy_stack, TOKEN_B) as b:
        r = b.post(
            "/v1/signals",
            json={"run_id": "run-b", "test_case": "x", "recipient": mailbox["address"]},
        )
    assert r.status_code == 403


def test_no_answer_to_b_ever_holds_a_subject_marker_or_message_id(
    tenancy_stack: Stack, world: World
) -> None:
    if not world.seen_by_b:  # run alone: make B's attempts now
        test_namespace_b_gets_404_on_every_object_of_namespace_a(tenancy_stack, world)
        test_namespace_b_lists_nothing_of_namespace_a(tenancy_stack, world)
    everything = "\n".join(world.seen_by_b)
    # (Ids and addresses B sent itself may be echoed in a 404; these it never sent.)
    for secret in (SUBJECT, "583920", world.message_id):
        assert secret not in everything
    # The marker equals the run id, which B itself sent (and a 404 may echo);
    # what must never come back is a message's marker.
    assert '"run_marker"' not in everything


# ---------------------------------------------------------------- operators


def test_operator_gets_403_on_every_route_that_acts_on_or_returns_content(
    tenancy_stack: Stack, world: World
) -> None:
    attempts = [
        ("POST", f"/v1/signals/{world.signal_id}/claim", {"run_id": world.run_id}),
        ("POST", f"/v1/claims/{world.claim_id}/consume", None),
        ("POST", f"/v1/claims/{world.claim_id}/release", None),
        ("POST", f"/v1/claims/{world.claim_id}/extend", {"lease_seconds": 60}),
        ("POST", "/v1/mailboxes", {"run_id": "run-ops"}),
        ("DELETE", f"/v1/mailboxes/{world.mailbox_id}", None),
        ("GET", f"/v1/runs/{world.run_id}/evidence", None),
        ("POST", "/v1/signals", {"run_id": "r", "test_case": "t", "recipient": "a@shared.test"}),
        ("POST", "/v1/inbound/sink", None),
    ]
    with client(tenancy_stack, OPS_TOKEN) as ops:
        for method, path, body in attempts:
            r = ops.request(method, path, json=body)
            assert r.status_code == 403, (method, path, r.text)
            assert r.json()["error"]["code"] == "ops_forbidden"
            assert SUBJECT not in r.text


def test_operator_reads_any_namespace_signal_with_its_subject_masked(
    tenancy_stack: Stack, world: World
) -> None:
    with client(tenancy_stack, OPS_TOKEN) as ops:
        one = ops.get(f"/v1/signals/{world.signal_id}")
        listed = ops.get("/v1/signals", params={"run_id": world.run_id})
        mine = ops.get("/v1/signals", params={"run_id": world.run_id, "namespace": "default"})
        theirs = ops.get("/v1/signals", params={"run_id": world.run_id, "namespace": "other"})
    assert one.status_code == 200
    assert one.json()["message"]["subject"] == "Welcome aboard, your code is <code>"
    assert {s["signal_id"] for s in listed.json()["items"]} >= {world.signal_id}
    assert {s["signal_id"] for s in mine.json()["items"]} >= {world.signal_id}
    assert theirs.json()["items"] == []
    for r in (one, listed, mine):
        assert "583920" not in r.text


def test_operator_lists_shows_and_discards_dead_letters_of_any_namespace(
    tenancy_stack: Stack, world: World
) -> None:
    with client(tenancy_stack, OPS_TOKEN) as ops:
        everything = ops.get("/v1/dead-letters")
        of_a = ops.get("/v1/dead-letters", params={"namespace": "default"})
        of_b = ops.get("/v1/dead-letters", params={"namespace": "other"})
        shown = ops.get(f"/v1/dead-letters/{world.dead_letter_id}")
        discarded = ops.post(
            f"/v1/dead-letters/{world.dead_letter_id}/discard", json={"note": "triaged"}
        )
    assert world.dead_letter_id in {d["dead_letter_id"] for d in everything.json()["items"]}
    assert world.dead_letter_id in {d["dead_letter_id"] for d in of_a.json()["items"]}
    assert world.dead_letter_id not in {d["dead_letter_id"] for d in of_b.json()["items"]}
    assert shown.status_code == 200 and shown.json()["signal_id"]
    assert discarded.status_code == 200, discarded.text
    assert discarded.json()["state"] == "discarded"


def test_operator_redrives_a_dead_letter_of_any_namespace(tenancy_stack: Stack) -> None:
    with client(tenancy_stack, TOKEN_B) as b:
        doomed = b.post(
            "/v1/signals",
            json={
                "run_id": f"run-{uuid.uuid4().hex[:8]}",
                "test_case": "doomed",
                "recipient": f"none-{uuid.uuid4().hex[:6]}@team-b.test",
                "expires_in_seconds": 1,
                "max_checks": 1,
            },
        ).json()

        def dead_letter() -> str | None:
            v = b.get(f"/v1/signals/{doomed['signal_id']}", params={"wait": 5}).json()
            return v["dead_letter"]["dead_letter_id"] if v.get("dead_letter") else None

        dead_letter_id = wait_until(dead_letter, 60, what="B's dead letter")
    with client(tenancy_stack, OPS_TOKEN) as ops:
        r = ops.post(f"/v1/dead-letters/{dead_letter_id}/redrive", json={"expires_in_seconds": 60})
    assert r.status_code == 200, r.text
    assert r.json()["signal_id"] == doomed["signal_id"]
    assert r.json()["status"] == "waiting"
