"""The synchronous client against a scripted API (no network)."""

from __future__ import annotations

import httpx
import pytest
from signalbox import (
    Signalbox,
    SignalExpired,
    SignalNotReady,
    WaitTimeout,
)
from signalbox_fakes import (
    CLAIM,
    DEAD_LETTER,
    MAILBOX,
    RECEIPT,
    FakeApi,
    FakeClock,
    reply,
    signal_view,
)

SIG = "/v1/signals/sig_1"


def test_url_and_token_fall_back_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIGNALBOX_URL", "http://env.test:9/")
    monkeypatch.setenv("SIGNALBOX_TOKEN", "env-token")
    sb = Signalbox()
    assert (sb.url, sb.token) == ("http://env.test:9", "env-token")
    assert sb._http.headers["Authorization"] == "Bearer env-token"


def test_default_url_is_local_port_8040(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIGNALBOX_URL", raising=False)
    monkeypatch.delenv("SIGNALBOX_TOKEN", raising=False)
    sb = Signalbox()
    assert sb.url == "http://127.0.0.1:8040"
    assert "Authorization" not in sb._http.headers


def test_mailbox_returns_typed_mailbox() -> None:
    api = FakeApi().on("POST", "/v1/mailboxes", reply(201, MAILBOX))
    box = api.client().mailbox("run-1")
    assert box.address == "x@sink.test" and box.mailbox_id == "mbx_1"
    assert box.expires_at is not None and box.expires_at.year == 2030
    assert api.body(api.requests[0]) == {"run_id": "run-1", "provider": "sink"}


def test_watch_sends_only_given_fields_and_the_idempotency_header() -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(201, signal_view()))
    handle = api.client().watch(
        "run-1",
        "t1",
        "a@sink.test",
        subject_contains="Verify",
        expires_in_seconds=2,
        require_run_marker=True,
        metadata={"commit": "abc"},
        idempotency_key="k-1",
    )
    request = api.requests[0]
    assert api.body(request) == {
        "run_id": "run-1",
        "test_case": "t1",
        "recipient": "a@sink.test",
        "subject_contains": "Verify",
        "expires_in_seconds": 2,
        "require_run_marker": True,
        "metadata": {"commit": "abc"},
    }
    assert request.headers["Idempotency-Key"] == "k-1"
    assert request.headers["Authorization"] == "Bearer tok"
    assert handle.signal_id == "sig_1" and handle.created is True


def test_watch_of_existing_key_is_not_marked_created() -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(202, signal_view()))
    handle = api.client().watch("run-1", "t1", "a@sink.test")
    assert handle.created is False
    assert "Idempotency-Key" not in api.requests[0].headers


def test_signal_view_is_typed() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("found")))
    s = api.client().get_signal("sig_1")
    assert s.result == "found" and not s.is_pending
    assert s.message is not None and s.message.subject == "Verify your account"
    assert s.last_check is not None and s.last_check.outcome == "no_match"
    assert s.raw["signal_id"] == "sig_1"


def test_wait_resumes_the_long_poll_until_found() -> None:
    api = FakeApi().on(
        "GET",
        SIG,
        reply(200, signal_view("waiting")),
        reply(200, signal_view("provider_error")),
        reply(200, signal_view("found")),
    )
    polls: list[str] = []
    found = api.client().wait("sig_1", timeout=300, on_poll=lambda v: polls.append(v.result))
    assert found.result == "found"
    assert polls == ["waiting", "provider_error", "found"]
    waits = [int(r.url.params["wait"]) for r in api.calls("GET", SIG)]
    assert waits and all(1 <= w <= 60 for w in waits)


def test_wait_splits_a_long_timeout_into_polls_of_at_most_60_seconds(clock: FakeClock) -> None:
    api = FakeApi().on("GET", SIG, clock.long_poll())
    with pytest.raises(WaitTimeout) as info:
        api.client().wait("sig_1", timeout=150)
    waits = [int(r.url.params["wait"]) for r in api.calls("GET", SIG)]
    assert waits == [60, 60, 30]
    assert info.value.signal is not None and info.value.signal.result == "waiting"


def test_wait_raises_signal_expired_with_the_dead_letter_diagnosis() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("expired", dead_letter=DEAD_LETTER)))
    with pytest.raises(SignalExpired) as info:
        api.client().wait("sig_1", timeout=10)
    err = info.value
    assert err.reason == "deadline"
    assert err.recommendation is not None and "before the window" in err.recommendation
    assert [m.why for m in err.near_misses] == ["received_before_window"]
    assert "deadline" in str(err)


def test_wait_fetches_the_dead_letter_when_the_view_only_references_it() -> None:
    api = (
        FakeApi()
        .on("GET", SIG, reply(200, signal_view("expired", dead_letter={"dead_letter_id": "dlq_1"})))
        .on("GET", "/v1/dead-letters/dlq_1", reply(200, DEAD_LETTER))
    )
    with pytest.raises(SignalExpired) as info:
        api.client().wait("sig_1", timeout=10)
    assert info.value.reason == "deadline"


def test_wait_rechecks_briefly_when_the_dead_letter_is_not_recorded_yet() -> None:
    api = FakeApi().on(
        "GET",
        SIG,
        reply(200, signal_view("expired")),
        reply(200, signal_view("expired", dead_letter=DEAD_LETTER)),
    )
    with pytest.raises(SignalExpired) as info:
        api.client().wait("sig_1", timeout=10)
    assert info.value.dead_letter is not None and info.value.reason == "deadline"


def test_handle_wait_keeps_the_last_view_on_timeout(clock: FakeClock) -> None:
    api = (
        FakeApi()
        .on("POST", "/v1/signals", reply(201, signal_view()))
        .on("GET", SIG, clock.long_poll())
    )
    handle = api.client().watch("run-1", "t1", "a@sink.test")
    with pytest.raises(WaitTimeout):
        handle.wait(timeout=5)
    assert handle.signal.checks == 3


def claim_api(*consume_replies: httpx.Response) -> FakeApi:
    return (
        FakeApi()
        .on("POST", "/v1/signals", reply(201, signal_view()))
        .on("POST", f"{SIG}/claim", reply(200, CLAIM))
        .on("POST", "/v1/claims/clm_1/consume", *(consume_replies or (reply(200, RECEIPT),)))
        .on("POST", "/v1/claims/clm_1/release", reply(200, {"status": "found"}))
    )


def test_claim_context_consumes_on_success_and_yields_typed_claim() -> None:
    api = claim_api()
    handle = api.client().watch("run-1", "t1", "a@sink.test")
    lease = handle.claim(lease_seconds=30)
    with lease as claim:
        assert claim.links == ("http://app.test/verify?t=abc",)
        assert claim.codes == ("123456",)
        assert claim.subject == "Verify your account"
    assert lease.receipt is not None and lease.receipt.receipt_id == "rcp_1"
    assert api.body(api.calls("POST", f"{SIG}/claim")[0]) == {
        "run_id": "run-1",
        "lease_seconds": 30,
    }
    assert not api.calls("POST", "/v1/claims/clm_1/release")


def test_claim_context_releases_on_exception_and_reraises() -> None:
    api = claim_api()
    handle = api.client().watch("run-1", "t1", "a@sink.test")
    with pytest.raises(RuntimeError, match="boom"), handle.claim():
        raise RuntimeError("boom")
    assert len(api.calls("POST", "/v1/claims/clm_1/release")) == 1
    assert not api.calls("POST", "/v1/claims/clm_1/consume")


def test_claim_context_keeps_the_original_error_when_release_fails() -> None:
    api = claim_api()
    api.routes[("POST", "/v1/claims/clm_1/release")] = [
        reply(409, {"error": {"code": "lease_expired", "message": "lapsed"}})
    ]
    handle = api.client().watch("run-1", "t1", "a@sink.test")
    with pytest.raises(ValueError), handle.claim():
        raise ValueError("original")


def test_explicit_consume_inside_the_context_is_not_repeated() -> None:
    api = claim_api()
    handle = api.client().watch("run-1", "t1", "a@sink.test")
    with handle.claim() as _claim:
        pass
    lease = handle.claim()
    receipt = lease.consume()
    with lease:
        pass
    assert receipt.evidence.run_marker == "matched"
    assert len(api.calls("POST", "/v1/claims/clm_1/consume")) == 2  # one per lease


def test_extend_returns_the_new_lease_end() -> None:
    api = claim_api().on(
        "POST", "/v1/claims/clm_1/extend", reply(200, {"lease_until": "2030-01-01T00:05:00Z"})
    )
    until = api.client().extend("clm_1", 300)
    assert until is not None and until.minute == 5
    assert api.body(api.requests[-1]) == {"lease_seconds": 300}


def test_claim_before_a_match_raises_signal_not_ready() -> None:
    api = FakeApi().on(
        "POST", f"{SIG}/claim", reply(202, {"status": "waiting", "retry_after_seconds": 4})
    )
    with pytest.raises(SignalNotReady) as info:
        api.client().claim("sig_1", "run-1")
    assert info.value.retry_after_seconds == 4


def test_evidence_is_typed_and_keeps_the_server_document() -> None:
    doc = {
        "run_id": "run-1",
        "signals": [
            {"signal_id": "sig_1", "test_case": "t1", "status": "consumed", "receipt": RECEIPT},
            {
                "signal_id": "sig_2",
                "test_case": "t2",
                "status": "expired",
                "dead_letter": DEAD_LETTER,
            },
        ],
    }
    api = FakeApi().on("GET", "/v1/runs/run-1/evidence", reply(200, doc))
    evidence = api.client().evidence("run-1")
    assert evidence.receipt_ids() == ["rcp_1"]
    assert evidence.signals[1].dead_letter is not None
    assert evidence.raw == doc


def test_dead_letter_calls_pass_filters_and_bodies() -> None:
    api = (
        FakeApi()
        .on("GET", "/v1/dead-letters", reply(200, {"items": [DEAD_LETTER], "next_cursor": None}))
        .on("GET", "/v1/dead-letters/dlq_1", reply(200, DEAD_LETTER))
        .on("POST", "/v1/dead-letters/dlq_1/redrive", reply(200, signal_view("waiting")))
        .on(
            "POST",
            "/v1/dead-letters/dlq_1/discard",
            reply(200, {**DEAD_LETTER, "state": "discarded"}),
        )
    )
    sb = api.client()
    page = sb.dead_letters(state="open", reason="deadline", provider="sink")
    assert [d.dead_letter_id for d in page.items] == ["dlq_1"] and page.next_cursor is None
    assert dict(api.requests[0].url.params) == {
        "state": "open",
        "reason": "deadline",
        "provider": "sink",
    }
    assert sb.dead_letter("dlq_1").checks_total == 7
    handle = sb.redrive("dlq_1", expires_in_seconds=60, max_checks=5)
    assert handle.signal.result == "waiting"
    assert api.body(api.requests[2]) == {"expires_in_seconds": 60, "max_checks": 5}
    discarded = sb.discard("dlq_1", note="flaky sender")
    assert discarded is not None and discarded.state == "discarded"
    assert api.body(api.requests[3]) == {"note": "flaky sender"}


def test_signals_of_a_run_follow_the_cursor() -> None:
    api = FakeApi().on(
        "GET",
        "/v1/signals",
        reply(200, {"items": [signal_view()], "next_cursor": "c2"}),
        reply(200, {"items": [signal_view(signal_id="sig_2")], "next_cursor": None}),
    )
    assert [s.signal_id for s in api.client().signals("run-1")] == ["sig_1", "sig_2"]
    assert api.requests[1].url.params["cursor"] == "c2"


def test_listeners_see_created_signals_and_receipts() -> None:
    api = claim_api()
    sb = api.client()
    events: list[tuple[str, str]] = []
    sb.listeners.append(lambda kind, obj: events.append((kind, type(obj).__name__)))
    with sb.watch("run-1", "t1", "a@sink.test").claim():
        pass
    assert events == [("signal", "Signal"), ("receipt", "Receipt")]


def test_handle_wait_without_timeout_lasts_until_expiry_and_raises_the_diagnosis(
    clock: FakeClock, expiring_api: FakeApi
) -> None:
    # The README's first-hour case: a signal that ends after 3 minutes (past the old
    # 120 s client default) must end the wait with its diagnosis, not a WaitTimeout.
    handle = expiring_api.client().watch("run-1", "t1", "a@sink.test")
    with pytest.raises(SignalExpired) as info:
        handle.wait()
    assert info.value.reason == "deadline"
    assert [m.why for m in info.value.near_misses] == ["received_before_window"]
    assert clock.now >= 1180
    assert handle.signal.result == "expired"


def test_a_shorter_timeout_raises_wait_timeout_with_the_view_and_the_expiry(
    clock: FakeClock,
) -> None:
    api = FakeApi().on("GET", SIG, clock.long_poll())
    with pytest.raises(WaitTimeout) as info:
        api.client().wait("sig_1", timeout=30)
    err = info.value
    assert err.signal is not None and err.signal.result == "waiting"
    assert err.expires_at is not None and err.expires_at.isoformat() == "2030-01-01T00:02:00+00:00"
    assert "expires at 2030-01-01T00:02:00Z" in str(err)


def test_wait_without_timeout_gives_up_on_a_signal_long_past_its_deadline() -> None:
    # Nothing expires it (no worker): waiting on would be forever.
    stale = signal_view("waiting", expires_at="2020-01-01T00:00:00Z")
    api = FakeApi().on("GET", SIG, reply(200, stale))
    with pytest.raises(WaitTimeout) as info:
        api.client().wait("sig_1")
    assert "after its deadline" in str(info.value) and "worker" in str(info.value)
