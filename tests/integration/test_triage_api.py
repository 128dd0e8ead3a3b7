"""Triage over the API: checks timelines, a claim read back by its holder,
dead letters by run, bulk redrive and discard, and operators across namespaces."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.helpers import (
    OPS_TOKEN,
    create_signal,
    db_rows,
    db_scalar,
    mail,
    wait_result,
)
from tests.stack import TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration


def expired(stack: Stack, count: int, token: str | None = None, **fields: object) -> list[dict]:
    """`count` signals that expire at once (deadline), with their dead letters."""
    run_id = str(fields.pop("run_id", f"run-{uuid.uuid4().hex[:8]}"))
    ids = []
    with stack.client(token) as api:
        for _ in range(count):
            payload = {
                "run_id": run_id,
                "test_case": f"case-{uuid.uuid4().hex[:6]}",
                "recipient": f"user-{uuid.uuid4().hex[:8]}@example.test",
                "expires_in_seconds": 1,
                **fields,
            }
            response = api.post("/v1/signals", json=payload)
            assert response.status_code == 201, response.text
            ids.append(response.json()["signal_id"])
    wait_until(
        lambda: (
            db_scalar(stack, "SELECT count(*) FROM dead_letters WHERE signal_id = ANY(%s)", ids)
            == count
        ),
        20,
        what="dead letters recorded",
    )
    with stack.client(token) as api:
        return [api.get(f"/v1/signals/{i}").json() for i in ids]


@pytest.fixture
def ops_api(ops_stack: Stack) -> Iterator[httpx.Client]:
    """A client of the ops API with alice's ops token."""
    with ops_stack.client(OPS_TOKEN) as client:
        yield client


# ---------------------------------------------------------------- checks


def test_checks_timeline_lists_each_check_oldest_first_across_a_redrive(stack: Stack) -> None:
    [view] = expired(stack, 1)
    dl_id = view["dead_letter"]["dead_letter_id"]
    with stack.client() as api:
        assert api.post(f"/v1/dead-letters/{dl_id}/redrive", json={}).status_code == 200
    stack.send(mail(view["recipient"]), [view["recipient"]])
    assert wait_result(stack, view["signal_id"])["status"] == "found"
    with stack.client() as api:
        body = api.get(f"/v1/signals/{view['signal_id']}/checks").json()
    items = body["items"]
    assert body["next_cursor"] is None
    assert len(items) == db_scalar(
        stack, "SELECT count(*) FROM checks WHERE signal_id = %s", view["signal_id"]
    )
    generations = [i["generation"] for i in items]
    assert generations == sorted(generations)
    # The first life's checks are the ones its dead letter counted.
    assert generations.count(1) == view["dead_letter"]["checks"]["total"]
    assert items[-1]["outcome"] == "matched" and items[-1]["generation"] == 2
    assert [i["started_at"] for i in items] == sorted(i["started_at"] for i in items)
    first = items[-1]
    assert set(first) == {
        "check_id",
        "reason",
        "outcome",
        "error_code",
        "started_at",
        "finished_at",
        "duration_ms",
        "messages_seen",
        "generation",
    }
    assert first["check_id"].startswith("chk_") and first["duration_ms"] >= 0


def test_checks_pages_with_an_opaque_cursor_and_refuses_a_forged_one(stack: Stack) -> None:
    [view] = expired(stack, 1, max_checks=5, expires_in_seconds=4)
    with stack.client() as api:
        seen, cursor = [], None
        while True:
            params = {"limit": 1, **({"cursor": cursor} if cursor else {})}
            page = api.get(f"/v1/signals/{view['signal_id']}/checks", params=params).json()
            seen += [i["check_id"] for i in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        bad = api.get(f"/v1/signals/{view['signal_id']}/checks", params={"cursor": "xyz"})
        too_many = api.get(f"/v1/signals/{view['signal_id']}/checks", params={"limit": 501})
    total = db_scalar(stack, "SELECT count(*) FROM checks WHERE signal_id = %s", view["signal_id"])
    assert len(seen) == len(set(seen)) == total >= 2
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "cursor"
    assert too_many.status_code == 422


def test_checks_of_another_namespace_are_404(stack: Stack) -> None:
    signal = create_signal(stack)
    with stack.client(TOKENS["other"]) as other:
        response = other.get(f"/v1/signals/{signal['signal_id']}/checks")
    assert response.status_code == 404


# ---------------------------------------------------------------- claims


def test_a_lost_claim_answer_is_read_again_with_its_content(stack: Stack) -> None:
    signal = create_signal(stack)
    stack.send(
        mail(signal["recipient"], body="Open https://app.example.test/v?t=abc code 493817"),
        [signal["recipient"]],
    )
    assert wait_result(stack, signal["signal_id"])["status"] == "found"
    with stack.client() as api:
        claimed = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        ).json()
        again = api.get(f"/v1/claims/{claimed['claim_id']}")
    assert again.status_code == 200
    assert again.json() == claimed
    assert "https://app.example.test/v?t=abc" in again.json()["links"]
    assert "493817" in again.json()["codes"]


def test_an_ended_claim_answers_410_with_its_state(stack: Stack) -> None:
    signal = create_signal(stack)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    wait_result(stack, signal["signal_id"])
    with stack.client() as api:
        url = f"/v1/signals/{signal['signal_id']}/claim"
        first = api.post(url, json={"run_id": signal["run_id"]}).json()
        api.post(f"/v1/claims/{first['claim_id']}/release")
        released = api.get(f"/v1/claims/{first['claim_id']}")
        second = api.post(url, json={"run_id": signal["run_id"], "lease_seconds": 5}).json()
        receipt = api.post(f"/v1/claims/{second['claim_id']}/consume").json()
        consumed = api.get(f"/v1/claims/{second['claim_id']}")
    assert released.status_code == 410 and released.json()["status"] == "released"
    assert "links" not in released.json() and "body_excerpt" not in released.json()
    assert consumed.status_code == 410 and consumed.json()["status"] == "consumed"
    assert consumed.json()["receipt"] == receipt


def test_a_claim_past_its_lease_is_410_lapsed_even_before_the_sweep(stack: Stack) -> None:
    signal = create_signal(stack)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    wait_result(stack, signal["signal_id"])
    with stack.client() as api:
        claimed = api.post(
            f"/v1/signals/{signal['signal_id']}/claim",
            json={"run_id": signal["run_id"], "lease_seconds": 5},
        ).json()
        db_rows(
            stack,
            "UPDATE claims SET lease_until = now() - interval '1 second' WHERE id = %s",
            claimed["claim_id"],
        )
        response = api.get(f"/v1/claims/{claimed['claim_id']}")
    assert response.status_code == 410 and response.json()["status"] == "lapsed"


def test_claims_are_not_readable_by_another_namespace_or_an_operator(
    stack: Stack, ops_api: httpx.Client
) -> None:
    signal = create_signal(stack)
    stack.send(mail(signal["recipient"]), [signal["recipient"]])
    wait_result(stack, signal["signal_id"])
    with stack.client() as api:
        claimed = api.post(
            f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": signal["run_id"]}
        ).json()
    with stack.client(TOKENS["other"]) as other:
        assert other.get(f"/v1/claims/{claimed['claim_id']}").status_code == 404
    forbidden = ops_api.get(f"/v1/claims/{claimed['claim_id']}")
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["code"] == "ops_forbidden"


# ---------------------------------------------------------------- dead letters


def test_dead_letters_filter_by_run_id(stack: Stack) -> None:
    mine = expired(stack, 2, run_id="run-wanted")
    expired(stack, 1, run_id="run-other")
    with stack.client() as api:
        page = api.get("/v1/dead-letters", params={"run_id": "run-wanted"}).json()
    assert sorted(d["signal_id"] for d in page["items"]) == sorted(v["signal_id"] for v in mine)


def test_bulk_redrive_moves_only_open_matching_dead_letters_and_checks_them(
    stack: Stack,
) -> None:
    wanted = expired(stack, 3, run_id="run-bulk")
    other_run = expired(stack, 1, run_id="run-keep")
    discarded_id = wanted[0]["dead_letter"]["dead_letter_id"]
    with stack.client() as api:
        api.post(f"/v1/dead-letters/{discarded_id}/discard", json={"note": "known flake"})
        done = api.post(
            "/v1/dead-letters/redrive",
            json={"filter": {"run_id": "run-bulk"}, "expires_in_seconds": 60, "max_checks": 5},
        )
        again = api.post("/v1/dead-letters/redrive", json={"filter": {"run_id": "run-bulk"}})
    assert done.status_code == 200, done.text
    expected = sorted(v["dead_letter"]["dead_letter_id"] for v in wanted[1:])
    assert sorted(done.json()["dead_letter_ids"]) == expected and done.json()["count"] == 2
    assert again.json() == {"dead_letter_ids": [], "count": 0}
    states = dict(db_rows(stack, "SELECT id, status FROM signals"))
    assert states[wanted[0]["signal_id"]] == "expired"
    assert states[other_run[0]["signal_id"]] == "expired"
    # Redriven signals were sent for a check: their mail is found.
    for view in wanted[1:]:
        stack.send(mail(view["recipient"]), [view["recipient"]])
        assert wait_result(stack, view["signal_id"])["status"] == "found"


def test_bulk_redrive_respects_its_limit_and_a_non_open_state_filter(stack: Stack) -> None:
    expired(stack, 3, run_id="run-limit")
    with stack.client() as api:
        none = api.post(
            "/v1/dead-letters/redrive",
            json={"filter": {"run_id": "run-limit", "state": "discarded"}},
        ).json()
        two = api.post(
            "/v1/dead-letters/redrive", json={"filter": {"run_id": "run-limit"}, "limit": 2}
        ).json()
        too_many = api.post("/v1/dead-letters/redrive", json={"limit": 501})
        unknown = api.post("/v1/dead-letters/redrive", json={"filter": {"colour": "red"}})
    assert none["count"] == 0 and two["count"] == 2
    assert too_many.status_code == 422 and too_many.json()["error"]["field"] == "limit"
    assert unknown.status_code == 422


def test_bulk_discard_records_the_note_and_needs_one(stack: Stack) -> None:
    views = expired(stack, 2, run_id="run-discard")
    with stack.client() as api:
        missing = api.post("/v1/dead-letters/discard", json={"filter": {"run_id": "run-discard"}})
        done = api.post(
            "/v1/dead-letters/discard",
            json={"filter": {"run_id": "run-discard"}, "note": "staging SMTP down"},
        ).json()
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "note"
    assert done["count"] == 2
    notes = db_rows(
        stack,
        "SELECT state, note FROM dead_letters WHERE signal_id = ANY(%s)",
        [v["signal_id"] for v in views],
    )
    assert notes == [("discarded", "staging SMTP down")] * 2


def test_a_tenant_bulk_action_never_reaches_another_namespace(stack: Stack) -> None:
    theirs = expired(stack, 1, token=TOKENS["other"], run_id="run-shared")
    mine = expired(stack, 1, run_id="run-shared")
    with stack.client() as api:
        named = api.post(
            "/v1/dead-letters/discard", json={"filter": {"namespace": "other"}, "note": "x"}
        ).json()
        listed = api.get("/v1/dead-letters", params={"namespace": "other"}).json()
        done = api.post("/v1/dead-letters/discard", json={"note": "mine only"}).json()
        shown = api.get(f"/v1/dead-letters/{theirs[0]['dead_letter']['dead_letter_id']}")
    assert named["count"] == 0 and listed["items"] == []
    assert done["dead_letter_ids"] == [mine[0]["dead_letter"]["dead_letter_id"]]
    assert shown.status_code == 404
    assert (
        db_scalar(
            stack, "SELECT state FROM dead_letters WHERE signal_id = %s", theirs[0]["signal_id"]
        )
        == "open"
    )


def test_an_operator_triages_every_namespace(stack: Stack, ops_api: httpx.Client) -> None:
    a = expired(stack, 1, run_id="run-ops")
    b = expired(stack, 1, token=TOKENS["other"], run_id="run-ops")
    everything = ops_api.get("/v1/dead-letters", params={"run_id": "run-ops"}).json()
    only_other = ops_api.get("/v1/dead-letters", params={"namespace": "other"}).json()
    shown = ops_api.get(f"/v1/dead-letters/{b[0]['dead_letter']['dead_letter_id']}")
    checks = ops_api.get(f"/v1/signals/{b[0]['signal_id']}/checks")
    redriven = ops_api.post(
        "/v1/dead-letters/redrive", json={"filter": {"namespace": "other", "run_id": "run-ops"}}
    ).json()
    single = ops_api.post(
        f"/v1/dead-letters/{a[0]['dead_letter']['dead_letter_id']}/discard", json={"note": "ok"}
    )
    assert {d["namespace"] for d in everything["items"]} == {"default", "other"}
    assert [d["signal_id"] for d in only_other["items"]] == [b[0]["signal_id"]]
    assert shown.status_code == 200 and shown.json()["namespace"] == "other"
    assert checks.status_code == 200 and checks.json()["items"]
    assert redriven["dead_letter_ids"] == [b[0]["dead_letter"]["dead_letter_id"]]
    assert single.status_code == 200 and single.json()["state"] == "discarded"
