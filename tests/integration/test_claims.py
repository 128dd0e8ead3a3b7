"""Claims, leases, fencing, receipts and evidence on the real stack."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from email.message import EmailMessage

import httpx
import psycopg
import pytest

from tests.integration.helpers import wait_result
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.integration

LINK = "https://app.example.test/verify?token=tok-8f2a91&user=42"
CODE = "731904"


def verification_mail(to: str, run_id: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = to
    msg["Subject"] = "Verify your account"
    msg["X-Signalbox-Run"] = run_id
    msg.set_content(f"Your code is {CODE}.\nOr open {LINK} to verify.")
    msg.add_alternative(
        f'<p>Your code is <b>{CODE}</b>.</p><a href="{LINK.replace("&", "&amp;")}">Verify</a>',
        subtype="html",
    )
    return bytes(msg)


def found_signal(stack: Stack, **fields: object) -> dict:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    recipient = f"user-{uuid.uuid4().hex[:6]}@example.test"
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={"run_id": run_id, "test_case": "test_claim", "recipient": recipient, **fields},
        ).json()
    stack.send(verification_mail(recipient, run_id), [recipient])
    view = wait_result(stack, signal["signal_id"])
    assert view["status"] == "found", view
    return view


def claim(stack: Stack, signal: dict, lease: int = 90, run_id: str | None = None) -> httpx.Response:
    with stack.client() as api:
        return api.post(
            f"/v1/signals/{signal['signal_id']}/claim",
            json={"run_id": run_id or signal["run_id"], "lease_seconds": lease},
        )


def test_claim_gives_the_content_a_consumer_needs(stack: Stack) -> None:
    signal = found_signal(stack)
    r = claim(stack, signal)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "claimed"
    assert body["claim_id"].startswith("clm_")
    assert body["message_id"] == signal["message"]["message_id"]
    assert body["links"] == [LINK]
    assert body["codes"] == [CODE]
    assert CODE in body["body_excerpt"] and len(body["body_excerpt"]) <= 500
    assert body["subject"] == "Verify your account"
    with stack.client() as api:
        view = api.get(f"/v1/signals/{signal['signal_id']}").json()
    assert view["status"] == "claimed" and view["result"] == "claimed"
    assert view["claim"]["claim_id"] == body["claim_id"]
    assert view["claim"]["lease_until"] == body["lease_until"]
    assert LINK not in str(view) and CODE not in str(view)


def test_fifty_concurrent_claims_give_exactly_one_winner(stack: Stack) -> None:
    signal = found_signal(stack)
    barrier = threading.Barrier(50)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def go() -> None:
        with httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=60
        ) as api:
            barrier.wait()
            r = api.post(
                f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
            )
        with lock:
            answers.append(r)

    threads = [threading.Thread(target=go) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    winners = [r for r in answers if r.status_code == 200]
    losers = [r for r in answers if r.status_code == 409]
    assert len(winners) == 1 and len(losers) == 49
    claim_id = winners[0].json()["claim_id"]
    for r in losers:
        assert r.json()["status"] == "already_claimed"
        assert r.json()["message_id"] == signal["message"]["message_id"]
        assert r.json()["claim_id"] == claim_id


def test_claim_before_a_match_answers_waiting_with_retry_after(stack: Stack) -> None:
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={"run_id": "run-early", "test_case": "t", "recipient": "nobody@example.test"},
        ).json()
        r = api.post(f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": "run-early"})
    assert r.status_code == 202
    assert r.json()["status"] == "waiting" and r.json()["retry_after_seconds"] >= 1


def test_claim_with_another_run_id_is_run_mismatch(stack: Stack) -> None:
    signal = found_signal(stack)
    r = claim(stack, signal, run_id="someone-else")
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "run_mismatch"


def test_a_claim_of_a_signal_whose_message_was_deleted_by_hand_takes_nothing(
    stack: Stack,
) -> None:
    """A found signal whose message is gone (signals.message_id set null) is
    404, and the claim, committed on its own, took nothing: still found, no
    claim used, no claim row."""
    signal = found_signal(stack)
    db = stack.env["SIGNALBOX_DATABASE_URL"]
    with psycopg.connect(db) as conn:
        (message_id,) = conn.execute(
            "SELECT message_id FROM signals WHERE id = %s", (signal["signal_id"],)
        ).fetchone()
        conn.execute("DELETE FROM messages WHERE id = %s", (message_id,))
    r = claim(stack, signal)
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "not_found"
    with psycopg.connect(db) as conn:
        status, used = conn.execute(
            "SELECT status, claims_used FROM signals WHERE id = %s", (signal["signal_id"],)
        ).fetchone()
        (claims,) = conn.execute(
            "SELECT count(*) FROM claims WHERE signal_id = %s", (signal["signal_id"],)
        ).fetchone()
    assert (status, used, claims) == ("found", 0, 0)


def test_claim_of_an_expired_signal_answers_410_with_the_dead_letter(stack: Stack) -> None:
    """A claim of an expired signal answers 410 with its dead letter."""
    with stack.client() as api:
        signal = api.post(
            "/v1/signals",
            json={
                "run_id": "run-x",
                "test_case": "t",
                "recipient": "late@example.test",
                "expires_in_seconds": 1,
            },
        ).json()
        # Until it is expired, whenever that is: a claim of a waiting signal
        # answers something else.
        wait_until(
            lambda: wait_result(stack, signal["signal_id"], wait=5)["status"] == "expired",
            30,
            what="the signal to expire",
        )
        r = api.post(f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": "run-x"})
    assert r.status_code == 410
    assert r.json()["status"] == "expired"
    assert r.json()["dead_letter"]["reason"] == "deadline"


def test_consume_returns_the_receipt_and_again_the_same_receipt(stack: Stack) -> None:
    signal = found_signal(stack, subject_contains="verify")
    claim_id = claim(stack, signal).json()["claim_id"]
    with stack.client() as api:
        first = api.post(f"/v1/claims/{claim_id}/consume")
        second = api.post(f"/v1/claims/{claim_id}/consume")
        view = api.get(f"/v1/signals/{signal['signal_id']}").json()
        again = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        )
    assert first.status_code == 200 and second.status_code == 200
    assert first.json() == second.json()
    receipt = first.json()
    assert receipt["message_id"] == signal["message"]["message_id"]
    assert receipt["evidence"]["recipient"] == "matched"
    assert receipt["evidence"]["subject"] == "matched"
    assert receipt["evidence"]["run_marker"] == "matched"
    assert view["status"] == "consumed" and view["receipt"]["receipt_id"] == receipt["receipt_id"]
    assert again.status_code == 409 and again.json()["status"] == "already_consumed"
    assert again.json()["receipt"]["receipt_id"] == receipt["receipt_id"]


def test_stale_holder_gets_lease_expired_after_another_consumer_claimed(stack: Stack) -> None:
    signal = found_signal(stack)
    stale = claim(stack, signal, lease=5).json()
    # Let the lease lapse (the sweep returns the signal to found).
    wait_until(
        lambda: wait_result(stack, signal["signal_id"], wait=0)["status"] == "found",
        20,
        what="the lease to lapse",
    )
    fresh = claim(stack, signal).json()
    with stack.client() as api:
        late = api.post(f"/v1/claims/{stale['claim_id']}/consume")
        ok = api.post(f"/v1/claims/{fresh['claim_id']}/consume")
    assert late.status_code == 409 and late.json()["error"]["code"] == "lease_expired"
    assert ok.status_code == 200
    assert ok.json()["claim_id"] == fresh["claim_id"]


def race(stack: Stack, paths: list[str]) -> list[tuple[str, httpx.Response]]:
    """POST each of `paths` at once, one thread and connection each."""
    barrier = threading.Barrier(len(paths))
    answers: list[tuple[str, httpx.Response]] = []
    lock = threading.Lock()

    def go(path: str) -> None:
        with httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=60
        ) as api:
            barrier.wait()
            r = api.post(path)
        with lock:
            answers.append((path, r))

    threads = [threading.Thread(target=go, args=(path,)) for path in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_concurrent_consumes_and_a_release_of_one_claim_leave_one_consistent_outcome(
    stack: Stack,
) -> None:
    """Twelve consumes and a release race on one claim: every consume that
    wins answers the same receipt, the losers lease_expired, and the rows
    agree (consumed with one receipt, or found again with none)."""
    db = stack.env["SIGNALBOX_DATABASE_URL"]
    for _ in range(3):
        signal = found_signal(stack)
        claim_id = claim(stack, signal).json()["claim_id"]
        answers = race(
            stack, [f"/v1/claims/{claim_id}/consume"] * 12 + [f"/v1/claims/{claim_id}/release"]
        )
        consumes = [r for path, r in answers if path.endswith("/consume")]
        consumed = [r for r in consumes if r.status_code == 200]
        refused = [r for r in consumes if r.status_code != 200]
        assert all(r.status_code == 409 for r in refused), [r.text for r in refused]
        assert all(r.json()["error"]["code"] == "lease_expired" for r in refused)
        assert len({r.json()["receipt_id"] for r in consumed}) <= 1
        with psycopg.connect(db) as conn:
            status = conn.execute(
                "SELECT status FROM signals WHERE id = %s", (signal["signal_id"],)
            ).fetchone()[0]
            state = conn.execute("SELECT state FROM claims WHERE id = %s", (claim_id,)).fetchone()[
                0
            ]
            receipts = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM receipts WHERE claim_id = %s", (claim_id,)
                ).fetchall()
            ]
        if consumed:
            assert (status, state) == ("consumed", "consumed")
            assert receipts == [consumed[0].json()["receipt_id"]]
        else:
            assert (status, state, receipts) == ("found", "released", [])


def test_a_consume_whose_lease_ran_out_writes_nothing_even_unlocked(stack: Stack) -> None:
    """The consume's one statement, committed on its own, refuses a claim
    whose lease ran out after it was read (the sweep not there yet): the
    signal stays claimed, the claim active, and no receipt is written."""
    from sqlalchemy import create_engine

    from app.db import claims as claims_db
    from app.settings import to_sqlalchemy_url

    signal = found_signal(stack)
    claim_id = claim(stack, signal, lease=300).json()["claim_id"]
    engine = create_engine(to_sqlalchemy_url(stack.env["SIGNALBOX_DATABASE_URL"]))
    try:
        with engine.connect() as conn:
            read = claims_db.claim_message_raw(conn, claim_id)
        assert read is not None and read["live"]
        with engine.begin() as conn:  # the lease runs out after the read
            conn.exec_driver_sql(
                "UPDATE claims SET lease_until = now() - interval '1 second' WHERE id = %(id)s",
                {"id": claim_id},
            )
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            receipt = claims_db.claim_consume(conn, read, {"id": "rcp_test", "evidence": {}})
            status = conn.exec_driver_sql(
                "SELECT status FROM signals WHERE id = %(id)s", {"id": signal["signal_id"]}
            ).scalar()
            state = conn.exec_driver_sql(
                "SELECT state FROM claims WHERE id = %(id)s", {"id": claim_id}
            ).scalar()
            receipts = conn.exec_driver_sql(
                "SELECT count(*) FROM receipts WHERE claim_id = %(id)s", {"id": claim_id}
            ).scalar()
    finally:
        engine.dispose()
    # Nothing written: no receipt, and the facts the guards saw say why.
    assert receipt["id"] is None
    assert (receipt["seen_state"], receipt["seen_live"]) == ("active", False)
    assert (status, state, receipts) == ("claimed", "active", 0)


def test_release_puts_the_signal_back_to_found_and_extend_moves_the_lease(stack: Stack) -> None:
    signal = found_signal(stack)
    held = claim(stack, signal, lease=30).json()
    with stack.client() as api:
        extended = api.post(f"/v1/claims/{held['claim_id']}/extend", json={"lease_seconds": 600})
        released = api.post(f"/v1/claims/{held['claim_id']}/release")
        after = api.post(f"/v1/claims/{held['claim_id']}/consume")
    assert extended.status_code == 200 and extended.json()["lease_until"] > held["lease_until"]
    assert released.status_code == 200 and released.json()["status"] == "found"
    assert after.status_code == 409 and after.json()["error"]["code"] == "lease_expired"


def test_unconsumed_claims_lapse_until_claims_exhausted_without_api_calls(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory({"SIGNALBOX_MAX_CLAIMS": "2"})
    stack.start()
    signal = found_signal(stack)
    db = stack.env["SIGNALBOX_DATABASE_URL"]
    assert claim(stack, signal, lease=5).status_code == 200
    with psycopg.connect(db) as conn:
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT status FROM signals WHERE id = %s", (signal["signal_id"],)
                ).fetchone()[0]
                == "found"
            ),
            20,
            what="first lease lapsed",
        )
    assert claim(stack, signal, lease=5).status_code == 200
    view = wait_result(stack, signal["signal_id"], wait=0)
    deadline = time.monotonic() + 25
    while view["status"] != "expired" and time.monotonic() < deadline:
        time.sleep(0.3)
        view = wait_result(stack, signal["signal_id"], wait=0)
    assert view["status"] == "expired"
    assert view["expiry_reason"] == "claims_exhausted"
    assert view["dead_letter"]["reason"] == "claims_exhausted"
    with psycopg.connect(db) as conn:
        states = conn.execute(
            "SELECT state FROM claims WHERE signal_id = %s ORDER BY fence", (signal["signal_id"],)
        ).fetchall()
    assert states == [("lapsed",), ("lapsed",)]


def test_evidence_holds_the_receipt_and_no_content_or_recipient(stack: Stack) -> None:
    signal = found_signal(stack)
    claim_id = claim(stack, signal).json()["claim_id"]
    with stack.client() as api:
        receipt = api.post(f"/v1/claims/{claim_id}/consume").json()
        evidence = api.get(f"/v1/runs/{signal['run_id']}/evidence")
    assert evidence.status_code == 200
    doc = evidence.json()
    text = json.dumps(doc)
    entry = doc["signals"][0]
    assert entry["receipt"]["receipt_id"] == receipt["receipt_id"]
    assert entry["status"] == "consumed"
    assert entry["timings"]["found_at"] and entry["timings"]["claimed_at"]
    assert entry["timings"]["consumed_at"]
    assert entry["checks"]["by_outcome"]["matched"] == 1
    from app.infra import keys
    from app.settings import load_settings

    # Keyed with the stack's own key (kept in its data directory).
    deployment = load_settings(data_dir=stack.data_dir, recipient_hash_key="")
    assert entry["recipient_hash"] == keys.recipient_hash(signal["recipient"], deployment)
    for secret in (CODE, LINK, "tok-8f2a91", signal["recipient"], stack.token, "Your code"):
        assert secret not in text


def test_deleting_a_mailbox_purges_its_messages_but_keeps_receipts(stack: Stack) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with stack.client() as api:
        box = api.post("/v1/mailboxes", json={"run_id": run_id}).json()
        signal = api.post(
            "/v1/signals", json={"run_id": run_id, "test_case": "t", "recipient": box["address"]}
        ).json()
    stack.send(verification_mail(box["address"], run_id), [box["address"]])
    signal = wait_result(stack, signal["signal_id"])
    receipt = None
    with stack.client() as api:
        claim_id = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": run_id}
        ).json()["claim_id"]
        receipt = api.post(f"/v1/claims/{claim_id}/consume").json()
        deleted = api.delete(f"/v1/mailboxes/{box['mailbox_id']}")
        again = api.delete(f"/v1/mailboxes/{box['mailbox_id']}")
        evidence = api.get(f"/v1/runs/{run_id}/evidence").json()
    assert deleted.status_code == 204 and again.status_code == 404
    with psycopg.connect(stack.env["SIGNALBOX_DATABASE_URL"]) as conn:
        assert conn.execute("SELECT count(*) FROM sink_messages").fetchone()[0] == 0
        assert (
            conn.execute("SELECT count(*) FROM messages WHERE raw IS NOT NULL").fetchone()[0] == 0
        )
    assert evidence["signals"][0]["receipt"]["receipt_id"] == receipt["receipt_id"]
