"""The synchronous client's retries and its mapping of error answers to exceptions."""

from __future__ import annotations

import httpx
import pytest
import signalbox
from signalbox import (
    AlreadyClaimed,
    AlreadyConsumed,
    Conflict,
    IdempotencyConflict,
    InvalidRequest,
    LeaseExpired,
    NotFound,
    RunMismatch,
    ServiceUnavailable,
    Signalbox,
    SignalboxError,
    SignalExpired,
    Unauthorized,
)
from signalbox_fakes import CLAIM, DEAD_LETTER, RECEIPT, FakeApi, reply, signal_view

SIG = "/v1/signals/sig_1"


def test_claim_is_never_retried_after_a_connection_error() -> None:
    api = FakeApi().on("POST", f"{SIG}/claim", httpx.ConnectError("refused"))
    with pytest.raises(ServiceUnavailable):
        api.client().claim("sig_1", "run-1")
    assert len(api.requests) == 1


def test_claim_is_never_retried_on_a_server_error() -> None:
    api = FakeApi().on("POST", f"{SIG}/claim", reply(503), reply(200, CLAIM))
    with pytest.raises(ServiceUnavailable):
        api.client().claim("sig_1", "run-1")
    assert len(api.requests) == 1


def test_get_is_retried_after_a_connection_error() -> None:
    api = FakeApi().on("GET", SIG, httpx.ConnectError("refused"), reply(200, signal_view("found")))
    assert api.client().get_signal("sig_1").result == "found"
    assert len(api.requests) == 2


def test_signal_create_is_retried_on_5xx_with_the_same_key() -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(503), reply(502), reply(201, signal_view()))
    api.client().watch("run-1", "t1", "a@sink.test", idempotency_key="k")
    assert [r.headers["Idempotency-Key"] for r in api.requests] == ["k", "k", "k"]


def test_consume_is_retried_on_5xx() -> None:
    api = FakeApi().on("POST", "/v1/claims/clm_1/consume", reply(500), reply(200, RECEIPT))
    assert api.client().consume("clm_1").receipt_id == "rcp_1"
    assert len(api.requests) == 2


def test_mailbox_create_is_not_retried() -> None:
    api = FakeApi().on("POST", "/v1/mailboxes", httpx.ReadTimeout("slow"))
    with pytest.raises(ServiceUnavailable):
        api.client().mailbox("run-1")
    assert len(api.requests) == 1


def test_retries_give_up_with_service_unavailable() -> None:
    api = FakeApi().on("GET", SIG, reply(503))
    with pytest.raises(ServiceUnavailable) as info:
        api.client(retries=2).get_signal("sig_1")
    assert len(api.requests) == 3 and info.value.status == 503


def test_unreachable_port_raises_service_unavailable() -> None:
    sb = Signalbox("http://127.0.0.1:9", "t", retries=0)
    with pytest.raises(ServiceUnavailable, match="cannot reach"):
        sb.get_signal("sig_1")


@pytest.mark.parametrize(
    ("status", "body", "expected", "code"),
    [
        (401, {"error": {"code": "unauthorized", "message": "bad token"}}, Unauthorized, None),
        (404, {"error": {"code": "not_found", "message": "no"}}, NotFound, None),
        (409, {"status": "run_mismatch"}, RunMismatch, "run_mismatch"),
        (409, {"error": {"code": "run_mismatch", "message": "m"}}, RunMismatch, "run_mismatch"),
        (409, {"error": {"code": "lease_expired", "message": "m"}}, LeaseExpired, "lease_expired"),
        (
            409,
            {"error": {"code": "idempotency_conflict", "message": "m"}},
            IdempotencyConflict,
            "idempotency_conflict",
        ),
        (
            409,
            {"detail": {"status": "already_claimed", "claim_id": "clm_9"}},
            AlreadyClaimed,
            "already_claimed",
        ),
        (409, {"error": {"code": "something_new", "message": "m"}}, Conflict, "something_new"),
        (500, {"error": {"code": "internal", "message": "oops"}}, ServiceUnavailable, None),
    ],
)
def test_error_bodies_map_to_typed_errors(
    status: int, body: object, expected: type[SignalboxError], code: str | None
) -> None:
    api = FakeApi().on("POST", f"{SIG}/claim", reply(status, body))
    with pytest.raises(expected) as info:
        api.client().claim("sig_1", "run-1")
    assert info.value.status == status and info.value.body == body
    if code is not None:
        assert info.value.code == code


def test_already_claimed_carries_the_holders_claim() -> None:
    body = {
        "status": "already_claimed",
        "claim_id": "clm_1",
        "message_id": "msg_1",
        "lease_until": "2030-01-01T00:01:37Z",
    }
    api = FakeApi().on("POST", f"{SIG}/claim", reply(409, body))
    with pytest.raises(AlreadyClaimed) as info:
        api.client().claim("sig_1", "run-2")
    assert info.value.claim_id == "clm_1" and isinstance(info.value, Conflict)


def test_already_consumed_carries_the_receipt() -> None:
    api = FakeApi().on(
        "POST", f"{SIG}/claim", reply(409, {"status": "already_consumed", "receipt": RECEIPT})
    )
    with pytest.raises(AlreadyConsumed) as info:
        api.client().claim("sig_1", "run-1")
    assert info.value.receipt is not None and info.value.receipt.receipt_id == "rcp_1"


def test_claim_of_expired_signal_raises_signal_expired_with_dead_letter() -> None:
    api = FakeApi().on(
        "POST", f"{SIG}/claim", reply(410, {"status": "expired", "dead_letter": DEAD_LETTER})
    )
    with pytest.raises(SignalExpired) as info:
        api.client().claim("sig_1", "run-1")
    assert info.value.reason == "deadline" and info.value.status == 410


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"code": "invalid", "message": "bad recipient", "field": "recipient"}},
        {"detail": [{"loc": ["body", "recipient"], "msg": "not an email", "type": "value_error"}]},
    ],
)
def test_invalid_request_names_the_field(body: object) -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(422, body))
    with pytest.raises(InvalidRequest) as info:
        api.client().watch("run-1", "t1", "not-an-address")
    assert info.value.field == "recipient"
    assert "recipient" in str(info.value)
    assert len(api.requests) == 1


def test_every_client_error_shares_one_root() -> None:
    for name in signalbox.__all__:
        obj = getattr(signalbox, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, SignalboxError), name
