"""Purged by owner (§12.5): deleting a mailbox, its expiry and retention
purge only content that belongs to one namespace alone, and never what a
waiting, found or claimed signal of any namespace points at or could match.

Two tenants on one stack, mail over SMTP: A ("default") and B ("other").
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.integration.helpers import db_rows, db_scalar, mail
from tests.integration.test_retention import run_retention
from tests.security.conftest import TOKEN_A, TOKEN_B
from tests.stack import SHARED_DOMAIN, Stack, wait_until

pytestmark = pytest.mark.integration

CODE = "771204"


def client(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def secret(to: str, subject: str) -> bytes:
    return mail(to, subject, body=f"Your code is {CODE}")


def watch(api: httpx.Client, recipient: str, subject: str, **fields: Any) -> dict[str, Any]:
    body = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}",
        "test_case": "purge",
        "recipient": recipient,
        "subject_contains": subject,
        **fields,
    }
    r = api.post("/v1/signals", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def found(api: httpx.Client, signal: dict[str, Any]) -> dict[str, Any]:
    def view() -> dict[str, Any] | None:
        v: dict[str, Any] = api.get(f"/v1/signals/{signal['signal_id']}", params={"wait": 5}).json()
        return v if v["status"] == "found" else None

    out: dict[str, Any] = wait_until(view, 60, what=f"{signal['signal_id']} found")
    return out


def claim(api: httpx.Client, signal: dict[str, Any]) -> str:
    r = api.post(f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]})
    assert r.status_code == 200, r.text
    return str(r.json()["claim_id"])


def read_text(api: httpx.Client, claim_id: str) -> httpx.Response:
    return api.get(f"/v1/claims/{claim_id}/message")


def sink_copies(stack: Stack, subject: str) -> int:
    return int(
        db_scalar(
            stack, "SELECT count(*) FROM sink_messages WHERE raw LIKE %s", f"%{subject}%".encode()
        )
    )


def body_kept(stack: Stack, subject: str) -> bool:
    rows = db_rows(stack, "SELECT raw IS NOT NULL FROM messages WHERE subject = %s", subject)
    assert rows, f"no observed message {subject}"
    return all(r[0] for r in rows)


def mailbox(api: httpx.Client) -> dict[str, Any]:
    r = api.post("/v1/mailboxes", json={"run_id": f"run-{uuid.uuid4().hex[:8]}"})
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def test_deleting_a_mailbox_keeps_mail_that_is_also_another_namespaces_or_in_play(
    tenancy_stack: Stack,
) -> None:
    """One mail to A's and B's mailboxes: A deletes its mailbox, B's signal
    created afterwards still finds it and B reads it. A's own claimed mail
    stays readable; A's mail to itself alone, with nothing in play, is purged."""
    stack = tenancy_stack
    tag = uuid.uuid4().hex[:8]
    both, claimed, alone = f"both-{tag}", f"claimed-{tag}", f"alone-{tag}"
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        box_a, box_b = mailbox(a), mailbox(b)
        since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
        stack.send(secret(box_a["address"], both), [box_a["address"], box_b["address"]])
        a_claimed = watch(a, box_a["address"], claimed)
        stack.send(secret(box_a["address"], claimed), [box_a["address"]])
        a_claim = claim(a, found(a, a_claimed))
        a_alone = watch(a, box_a["address"], alone)
        stack.send(secret(box_a["address"], alone), [box_a["address"], "nobody@example.test"])
        a_alone_claim = claim(a, found(a, a_alone))
        assert a.post(f"/v1/claims/{a_alone_claim}/consume").status_code == 200
        assert sink_copies(stack, both) == 1

        assert a.delete(f"/v1/mailboxes/{box_a['mailbox_id']}").status_code == 204

        # A's alone: purged, both the sink's copy and the observed body.
        assert sink_copies(stack, alone) == 0
        assert not body_kept(stack, alone)
        # A's claimed: a claimed signal points at it.
        kept = read_text(a, a_claim)
        assert kept.status_code == 200, kept.text
        assert CODE in kept.json()["text"]
        # B's: B owns a recipient too; B's look after the delete still finds it.
        assert sink_copies(stack, both) == 1
        b_sig = watch(b, box_b["address"], both, received_after=since)
        b_claim = read_text(b, claim(b, found(b, b_sig)))
        assert b_claim.status_code == 200, b_claim.text
        assert CODE in b_claim.json()["text"]


def test_a_mailbox_expiry_purges_nothing_of_either_namespace(tenancy_stack: Stack) -> None:
    """The TTL path: A's mailbox expires (retention deletes it) while B's
    claimed signal points at a mail A's mailbox also received. Expiry purges
    nothing: A's own mail stays readable until the content horizon (the
    mailbox of a failed test is kept), and B's is untouched."""
    stack = tenancy_stack
    tag = uuid.uuid4().hex[:8]
    both, alone = f"ttl-both-{tag}", f"ttl-alone-{tag}"
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        box_a, box_b = mailbox(a), mailbox(b)
        b_sig = watch(b, box_b["address"], both)
        stack.send(secret(box_b["address"], both), [box_a["address"], box_b["address"]])
        b_claim = claim(b, found(b, b_sig))
        a_sig = watch(a, box_a["address"], alone)
        stack.send(secret(box_a["address"], alone), [box_a["address"]])
        a_claim = claim(a, found(a, a_sig))
        assert a.post(f"/v1/claims/{a_claim}/consume").status_code == 200

        db_rows(
            stack,
            "UPDATE mailboxes SET expires_at = now() - interval '1 second' WHERE id = %s",
            box_a["mailbox_id"],
        )
        run_retention(stack)
        assert (
            db_scalar(
                stack,
                "SELECT deleted_at IS NOT NULL FROM mailboxes WHERE id = %s",
                box_a["mailbox_id"],
            )
            is True
        )

        assert sink_copies(stack, alone) == 1
        assert body_kept(stack, alone)
        assert sink_copies(stack, both) == 1
        assert body_kept(stack, both)
        kept = read_text(b, b_claim)
        assert kept.status_code == 200, kept.text
        assert CODE in kept.json()["text"]


def test_retention_keeps_a_consumed_message_another_namespaces_found_signal_points_at(
    tenancy_stack: Stack,
) -> None:
    """A shared address: A's and B's signals take one mail; A consumes it
    and its signal ages past the content horizon; B's `found` signal still
    points at it, so its body stays. A's mail to its own address, consumed
    and aged alike, loses its body (the purge itself still works)."""
    stack = tenancy_stack
    tag = uuid.uuid4().hex[:8]
    shared = f"qa-{tag}@{SHARED_DOMAIN}"
    own = f"own-{tag}@team-a.test"
    shared_subject, own_subject = f"shared-{tag}", f"own-{tag}"
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        a_shared = watch(a, shared, shared_subject)
        b_shared = watch(b, shared, shared_subject)
        a_own = watch(a, own, own_subject)
        stack.send(secret(shared, shared_subject), [shared])
        stack.send(secret(own, own_subject), [own])
        for signal in (a_shared, a_own):
            claim_id = claim(a, found(a, signal))
            assert a.post(f"/v1/claims/{claim_id}/consume").status_code == 200
        b_view = found(b, b_shared)
        assert b_view["message"]["message_id"] == db_scalar(
            stack, "SELECT message_id FROM signals WHERE id = %s", a_shared["signal_id"]
        )
        db_rows(
            stack,
            "UPDATE signals SET updated_at = now() - interval '100 hours' WHERE id = ANY(%s)",
            [a_shared["signal_id"], a_own["signal_id"]],
        )
        run_retention(stack)

        assert not body_kept(stack, own_subject)
        assert body_kept(stack, shared_subject)
        kept = read_text(b, claim(b, b_shared))
        assert kept.status_code == 200, kept.text
        assert CODE in kept.json()["text"]
