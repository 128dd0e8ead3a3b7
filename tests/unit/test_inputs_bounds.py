"""Input bounds: the received_after window and text the database can store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from app.errors import InvalidInput
from app.usecases.inputs import SignalCreate, check_received_after

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def window(at: datetime | None) -> None:
    check_received_after(at, NOW, lookback_hours=24, lookahead_hours=1)


def create(**fields: object) -> SignalCreate:
    base: dict[str, object] = {"run_id": "r1", "test_case": "t", "recipient": "a@example.test"}
    return SignalCreate.model_validate({**base, **fields})


@pytest.mark.parametrize(
    "at",
    [None, NOW, NOW - timedelta(hours=24), NOW + timedelta(hours=1), NOW - timedelta(hours=23)],
)
def test_received_after_inside_the_window_is_accepted(at: datetime | None) -> None:
    window(at)


@pytest.mark.parametrize(
    "at",
    [
        NOW - timedelta(hours=24, seconds=1),
        NOW + timedelta(hours=1, seconds=1),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, tzinfo=UTC),
    ],
)
def test_received_after_outside_the_window_is_invalid_naming_the_field(at: datetime) -> None:
    with pytest.raises(InvalidInput) as raised:
        window(at)
    assert raised.value.field == "received_after"


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-05:00"])
def test_received_after_that_overflows_in_utc_is_a_validation_error(text: str) -> None:
    with pytest.raises(ValidationError) as raised:
        create(received_after=text)
    assert raised.value.errors()[0]["loc"] == ("received_after",)


def test_received_after_is_kept_in_utc() -> None:
    got = create(received_after="2026-11-30T13:00:00+01:00").received_after
    assert got == NOW and got.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("test_case", "a\x00b"),
        ("subject_contains", "\ud800"),
        ("recipient", "a\x00@example.test"),
        ("metadata", {"k": ["ok", "bad\x00"]}),
        ("metadata", {"bad\x00key": 1}),
    ],
)
def test_text_the_database_cannot_store_is_invalid_naming_the_field(
    field: str, value: object
) -> None:
    with pytest.raises(ValidationError) as raised:
        create(**{field: value})
    assert raised.value.errors()[0]["loc"] == (field,)
