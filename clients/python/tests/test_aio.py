"""The asyncio client mirrors the sync one (no network)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from signalbox import AsyncSignalbox, ServiceUnavailable, SignalExpired, WaitTimeout
from signalbox_fakes import CLAIM, DEAD_LETTER, RECEIPT, FakeApi, FakeClock, reply, signal_view

SIG = "/v1/signals/sig_1"


def api_for_claims() -> FakeApi:
    return (
        FakeApi()
        .on("POST", "/v1/signals", reply(201, signal_view()))
        .on("GET", SIG, reply(200, signal_view("waiting")), reply(200, signal_view("found")))
        .on("POST", f"{SIG}/claim", reply(200, CLAIM))
        .on("POST", "/v1/claims/clm_1/consume", reply(200, RECEIPT))
        .on("POST", "/v1/claims/clm_1/release", reply(200, {}))
    )


def test_async_watch_wait_and_claim_context_consume() -> None:
    api = api_for_claims()

    async def scenario() -> str | None:
        async with api.aclient() as sb:
            handle = await sb.watch("run-1", "t1", "a@sink.test", subject_contains="Verify")
            found = await handle.wait(timeout=60)
            assert found.result == "found"
            lease = handle.claim()
            async with lease as claim:
                assert claim.codes == ("123456",)
            return lease.receipt.receipt_id if lease.receipt else None

    assert asyncio.run(scenario()) == "rcp_1"
    assert len(api.calls("POST", "/v1/claims/clm_1/consume")) == 1


def test_async_claim_context_releases_on_exception() -> None:
    api = api_for_claims()

    async def scenario() -> None:
        async with api.aclient() as sb, sb.claim("sig_1", "run-1"):
            raise KeyError("boom")

    with pytest.raises(KeyError):
        asyncio.run(scenario())
    assert len(api.calls("POST", "/v1/claims/clm_1/release")) == 1
    assert not api.calls("POST", "/v1/claims/clm_1/consume")


def test_awaiting_the_claim_gives_explicit_consume() -> None:
    api = api_for_claims()

    async def scenario() -> str:
        async with api.aclient() as sb:
            lease = await sb.claim("sig_1", "run-1", lease_seconds=30)
            assert lease.claim.claim_id == "clm_1"
            return (await lease.consume()).receipt_id

    assert asyncio.run(scenario()) == "rcp_1"


def test_async_wait_raises_signal_expired_with_diagnosis() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("expired", dead_letter=DEAD_LETTER)))

    async def scenario() -> None:
        async with api.aclient() as sb:
            await sb.wait("sig_1", timeout=5)

    with pytest.raises(SignalExpired) as info:
        asyncio.run(scenario())
    assert info.value.reason == "deadline"


def test_async_claim_is_not_retried_but_get_is() -> None:
    api = (
        FakeApi()
        .on("POST", f"{SIG}/claim", httpx.ConnectError("refused"))
        .on("GET", SIG, httpx.ConnectError("refused"), reply(200, signal_view("found")))
    )

    async def scenario() -> None:
        sb: AsyncSignalbox = api.aclient()
        with pytest.raises(ServiceUnavailable):
            await sb.claim("sig_1", "run-1")
        assert (await sb.get_signal("sig_1")).result == "found"
        await sb.aclose()

    asyncio.run(scenario())
    assert len(api.calls("POST", f"{SIG}/claim")) == 1
    assert len(api.calls("GET", SIG)) == 2


def test_async_handle_wait_without_timeout_lasts_until_expiry(
    clock: FakeClock, expiring_api: FakeApi
) -> None:
    async def scenario() -> None:
        async with expiring_api.aclient() as sb:
            handle = await sb.watch("run-1", "t1", "a@sink.test")
            await handle.wait()

    with pytest.raises(SignalExpired) as info:
        asyncio.run(scenario())
    assert info.value.reason == "deadline" and clock.now >= 1180


def test_async_wait_timeout_carries_the_view_and_the_expiry(clock: FakeClock) -> None:
    api = FakeApi().on("GET", SIG, clock.long_poll())

    async def scenario() -> None:
        async with api.aclient() as sb:
            await sb.wait("sig_1", timeout=10)

    with pytest.raises(WaitTimeout) as info:
        asyncio.run(scenario())
    assert info.value.signal is not None and info.value.expires_at is not None
