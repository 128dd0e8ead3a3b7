"""Cursors: whatever a caller sends, a page position or a 422 naming `cursor`."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import InvalidInput
from app.usecases.views import decode_cursor, encode_cursor


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def assert_position_or_invalid(cursor: str) -> None:
    try:
        at, object_id = decode_cursor(cursor)
    except InvalidInput as exc:
        assert exc.field == "cursor"
        return
    assert at.tzinfo is not None
    assert "\x00" not in object_id and object_id.isascii()


def test_a_cursor_the_api_made_decodes_to_its_position() -> None:
    at = datetime(2026, 11, 30, 4, 5, 6, 789000, tzinfo=UTC)
    assert decode_cursor(encode_cursor(at, "sig_0123abcd")) == (at, "sig_0123abcd")


@pytest.mark.parametrize(
    "cursor",
    [
        b64(b"[" * 4000),
        b64(b"[" * 40),
        "[" * 4000,
        b64(json.dumps(["2026-01-01T00:00:00+00:00", "sig_\u0000x"]).encode()),
        b64(json.dumps(["2026-01-01T00:00:00+00:00", "sig_\ud800"]).encode()),
        b64(json.dumps(["2026-01-01T00:00:00", "sig_abc"]).encode()),  # naive
        b64(json.dumps(["0001-01-01T00:00:00+01:00", "sig_abc"]).encode()),  # overflows UTC
        b64(json.dumps({"a": 1}).encode()),
        b64(json.dumps([1, 2, 3]).encode()),
        b64(json.dumps([1, "sig_abc"]).encode()),
        b64(b"\xff\xfe"),
        "é",
        "",
        "!!!!",
    ],
)
def test_malformed_cursor_is_invalid_input_naming_cursor(cursor: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        decode_cursor(cursor)
    assert raised.value.field == "cursor"


@given(st.text(max_size=400))
def test_any_text_is_a_position_or_invalid_input(cursor: str) -> None:
    assert_position_or_invalid(cursor)


@given(st.binary(max_size=300))
def test_any_bytes_encoded_are_a_position_or_invalid_input(raw: bytes) -> None:
    assert_position_or_invalid(b64(raw))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=10,
)


@given(st.lists(json_values, min_size=0, max_size=3))
def test_any_json_encoded_is_a_position_or_invalid_input(value: list[object]) -> None:
    assert_position_or_invalid(b64(json.dumps(value).encode()))


@given(
    st.datetimes(timezones=st.just(UTC)),
    st.from_regex(r"[a-z]{3}_[0-9a-f]{24}", fullmatch=True),
)
def test_every_encoded_position_round_trips(at: datetime, object_id: str) -> None:
    assert decode_cursor(encode_cursor(at, object_id)) == (at, object_id)
