"""The sink reads MAIL FROM / RCPT TO paths exactly as aiosmtpd does, and
counts its sessions in all and per client address.

`_CappedSMTP._getaddr` skips aiosmtpd's RFC 5322 parser for a plain
`<address>`; for any argument, its answer must be aiosmtpd's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from aiosmtpd.smtp import SMTP
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.smtp.server import _CappedSMTP, _ConnectionGate

TOKENS = [
    "<",
    ">",
    "<>",
    "a@example.com",
    "A.B@Example.ORG",
    "x+tag@sub.example.test",
    "a..b@example.com",
    ".a@example.com",
    "a@example..com",
    "a@[127.0.0.1]",
    '"quoted local"@example.com',
    "@route:",
    " ",
    "\t",
    "SIZE=100",
    "BODY=8BITMIME",
    "(comment)",
    "(",
    "x" * 70 + "@example.com",
    "é",
    ",",
]

args = st.lists(st.sampled_from(TOKENS), max_size=6).map("".join)


@pytest.fixture(scope="module", params=[0, 64], ids=["no-local-part-limit", "limit-64"])
def session(request: pytest.FixtureRequest) -> Iterator[_CappedSMTP]:
    loop = asyncio.new_event_loop()
    try:
        smtp = _CappedSMTP(object(), gate=_ConnectionGate(1), loop=loop)
        smtp.local_part_limit = request.param
        yield smtp
    finally:
        loop.close()


def _outcome(read: Callable[[str], object], arg: str) -> object:
    try:
        return read(arg)
    except Exception as exc:  # aiosmtpd's parser raises on some paths ("<")
        return type(exc)


@settings(max_examples=800, deadline=None)
@given(arg=args)
@example(arg="<a@example.com> SIZE=100 BODY=8BITMIME")
@example(arg="<a@example.com>(comment) SIZE=1")
@example(arg="<a@example.com> \t SIZE=1")
@example(arg=" <a@example.com>")
@example(arg="<" + "x" * 70 + "@example.com>")
def test_a_path_reads_as_aiosmtpd_reads_it(session: _CappedSMTP, arg: str) -> None:
    ours = _outcome(session._getaddr, arg)
    assert ours == _outcome(lambda a: SMTP._getaddr(session, a), arg)


def test_a_plain_path_reads_as_written_within_the_local_part_limit(
    session: _CappedSMTP,
) -> None:
    assert session._getaddr("<User@Example.test> SIZE=10") == ("User@Example.test", "SIZE=10")
    long_local = "x" * 70 + "@example.com"
    expected = (None, None) if session.local_part_limit else (long_local, "")
    assert session._getaddr(f"<{long_local}>") == expected


# --------------------------------------------------------------------------- limits


def test_the_gate_holds_each_address_to_its_share_and_all_to_the_limit() -> None:
    gate = _ConnectionGate(3, per_address=2)
    assert [gate.enter("10.0.0.1"), gate.enter("10.0.0.1")] == [None, None]
    assert gate.enter("10.0.0.1") == "too many open SMTP sessions from one address"
    assert gate.enter("10.0.0.2") is None
    assert gate.enter("10.0.0.3") == "too many open SMTP sessions"
    gate.leave("10.0.0.1")
    assert gate.enter("10.0.0.3") is None
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        gate.leave(address)
    # Refusals took no place; every place taken was given back.
    assert (gate.open, gate.by_address) == (0, {})


@pytest.mark.parametrize(("idle", "first"), [(60.0, 10.0), (10.0, 10.0), (2.0, 2.0)])
def test_before_its_first_command_a_client_has_min_10_and_the_idle_limit(
    idle: float, first: float
) -> None:
    loop = asyncio.new_event_loop()
    try:
        smtp = _CappedSMTP(object(), gate=_ConnectionGate(1), loop=loop, timeout=idle)
        assert smtp._first_command_seconds == first
    finally:
        loop.close()
