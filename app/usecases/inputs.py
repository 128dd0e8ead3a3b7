"""Validated input of the use cases, shared by every front door (API, CLI, MCP)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.domain.expectations import MAX_SETTLE_SECONDS, MIN_SETTLE_SECONDS

if TYPE_CHECKING:
    from app.errors import InvalidInput

RUN_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
# Provider and namespace names: a safe alphabet, never a NUL.
NAME_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN, min_length=1, max_length=128)]
_EMAIL = re.compile(
    r"^[^@\s<>()\[\],;:\"]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$"
)
METADATA_MAX_BYTES = 4096


def normalise_address(value: str) -> str:
    """Lower-cased whole address (plus-tags kept); raise ValueError if not one."""
    address = value.strip()
    if len(address) > 320 or not _EMAIL.match(address):
        raise ValueError("must be an email address like name@example.com")
    return address.lower()


def _storable(value: Any) -> bool:
    """True when every string in `value` (keys included) can be stored: no NUL,
    no lone surrogate (PostgreSQL rejects both)."""
    if isinstance(value, str):
        return "\x00" not in value and not any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_storable(v) for v in value)
    return True


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_unstorable_text(cls, value: Any) -> Any:
        if not _storable(value):
            raise ValueError("must not contain NUL characters or lone surrogates")
        return value


class SignalCreate(_Input):
    run_id: RunId
    test_case: str = Field(min_length=1, max_length=200)
    recipient: str
    subject_contains: str | None = Field(default=None, max_length=1000)
    body_contains: str | None = Field(default=None, max_length=1000)
    received_after: datetime | None = None
    expires_in_seconds: int = Field(default=120, ge=1, le=86400)
    max_checks: int = Field(default=30, ge=1, le=10000)
    provider: str = Field(default="sink", min_length=1, max_length=128)
    require_run_marker: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    # What the signal asserts (docs/api.md, "Assertions").
    expect: Literal["first", "exactly_one", "none"] = "first"
    settle_seconds: int | None = Field(default=None, ge=MIN_SETTLE_SECONDS, le=MAX_SETTLE_SECONDS)

    @field_validator("settle_seconds")
    @classmethod
    def _settle_only_for_exactly_one(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("expect", "first") != "exactly_one":
            raise ValueError("applies only to expect 'exactly_one'")
        return value

    @field_validator("recipient")
    @classmethod
    def _recipient(cls, value: str) -> str:
        return normalise_address(value)

    @field_validator("received_after")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("must carry a timezone, e.g. 2026-01-01T00:00:00Z")
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError("is out of range") from None

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(value, separators=(",", ":")).encode()) > METADATA_MAX_BYTES:
            raise ValueError("must be at most 4 KiB as JSON")
        return value


class MailboxCreate(_Input):
    run_id: RunId
    provider: str = Field(default="sink", min_length=1, max_length=128)


class ClaimCreate(_Input):
    run_id: RunId
    lease_seconds: int = Field(default=90, ge=5, le=900)
    # Who holds the claim (a pod, a worker); default the token's name.
    owner: str | None = Field(default=None, min_length=1, max_length=200)


class ClaimExtend(_Input):
    lease_seconds: int = Field(default=90, ge=5, le=900)


class Redrive(_Input):
    expires_in_seconds: int = Field(default=120, ge=1, le=86400)
    max_checks: int = Field(default=30, ge=1, le=10000)


class Discard(_Input):
    note: str = Field(min_length=1, max_length=2000)


class Cancel(_Input):
    """Why a producer ends its signal (`test_failed`, `test_ended`, or its own words)."""

    reason: str = Field(min_length=1, max_length=200)

    @field_validator("reason")
    @classmethod
    def _one_printable_line(cls, value: str) -> str:
        if not value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("must be 1-200 printable characters on one line")
        return value


def check_received_after(
    received_after: datetime | None, now: datetime, *, lookback_hours: float, lookahead_hours: float
) -> None:
    """`received_after` must lie within [now - lookback, now + lookahead] of the
    server's clock; else InvalidInput naming the field."""
    if received_after is None:
        return
    early = received_after < now - timedelta(hours=lookback_hours)
    if early or received_after > now + timedelta(hours=lookahead_hours):
        raise received_after_error(
            early=early, lookback_hours=lookback_hours, lookahead_hours=lookahead_hours
        )


def received_after_error(
    *, early: bool, lookback_hours: float, lookahead_hours: float
) -> InvalidInput:
    """The error of a `received_after` before the lookback (`early`) or after
    the lookahead."""
    from app.errors import InvalidInput

    if early:
        return InvalidInput(
            f"received_after: must be at most {lookback_hours:g} h before the server's clock"
            " (SIGNALBOX_MAX_LOOKBACK_HOURS)",
            field="received_after",
        )
    return InvalidInput(
        f"received_after: must be at most {lookahead_hours:g} h after the server's clock",
        field="received_after",
    )
