"""The kinds of row the repository's statements return, as TypedDicts: a
statement is typed by its row (`Statement[ClaimRow]`) and the runner casts,
so a caller reads typed keys at no cost (the rows are psycopg's dicts).

`total=False` where statements of a table return different subsets of its
columns (a kind names every column any of them returns)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict


class NamespaceRow(TypedDict):
    namespace: str


class ChaosRuleRow(TypedDict, total=False):
    id: str
    namespace: str
    position: int
    recipient: str
    stage: str
    reply: str
    times: int | None
    probability: float | None
    applied: int
    created_at: datetime
    expires_at: datetime
    exhausted: bool


class RefusalRow(TypedDict):
    refused_at: datetime
    code: int
    reason: str
    detail: str
    recipients: list[str]


class SinkMessageRow(TypedDict, total=False):
    id: int
    received_at: datetime
    mail_from: str | None
    envelope_recipients: list[str]
    all_recipients: list[str]
    size: int
    raw: bytes
    auth_namespace: str | None
    message_id: str | None


class ClaimIdRow(TypedDict):
    id: str


class SignalRow(TypedDict, total=False):
    """A signal's columns (`RETURNING *` returns them all)."""

    id: str
    namespace: str
    idempotency_key: str
    run_id: str
    test_case: str
    recipient: str
    subject_contains: str | None
    body_contains: str | None
    received_after: datetime
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    max_checks: int
    provider: str
    require_run_marker: bool
    metadata: dict[str, Any]
    status: str
    expiry_reason: str | None
    expired_at: datetime | None
    generation: int
    checks_count: int
    checks_archived: dict[str, int]
    consecutive_errors: int
    next_check_at: datetime | None
    next_check_reason: str
    enqueued_at: datetime | None
    check_fence: int
    check_lease_until: datetime | None
    last_check_at: datetime | None
    last_look_at: datetime | None
    last_outcome: str | None
    last_error_code: str | None
    message_id: str | None
    found_at: datetime | None
    claim_fence: int
    claims_used: int
    max_claims: int
    expect: str
    settle_seconds: int | None
    cancel_reason: str | None
    cancelled_at: datetime | None


class IdRow(TypedDict):
    id: str


class CountRow(TypedDict):
    count: int


class DeadLetterRow(TypedDict, total=False):
    id: str
    signal_id: str
    generation: int
    namespace: str
    run_id: str
    provider: str
    reason: str
    state: str
    created_at: datetime
    checks_total: int
    checks_by_outcome: dict[str, int]
    last_error_code: str | None
    near_misses: list[dict[str, Any]]
    recommendation: str
    note: str | None
    resolved_at: datetime | None
    late_message: dict[str, Any] | None
    duplicates: dict[str, Any] | None
    published_at: datetime | None
    publish_attempt_at: datetime | None
    alerted_at: datetime | None


class MailboxRow(TypedDict, total=False):
    id: str
    namespace: str
    run_id: str
    provider: str
    address: str
    created_at: datetime
    expires_at: datetime
    deleted_at: datetime | None


class MessageRow(TypedDict, total=False):
    """An observed message's columns (statements return subsets)."""

    id: str
    provider: str
    provider_message_id: str
    received_at: datetime
    observed_at: datetime
    subject: str
    recipients: list[str]
    run_marker: str | None
    size: int
    delivered_to: list[str] | None
    bare_lf: bool
    auth_namespace: str | None
    raw: bytes | None
    from_addr: str | None
    to_addrs: list[str] | None
    cc_addrs: list[str] | None
    header_message_id: str | None
    attachments: int
    read_at: datetime | None


class CheckRow(TypedDict, total=False):
    id: int
    signal_id: str
    generation: int
    fence: int
    provider: str
    reason: str
    outcome: str
    error_code: str | None
    counted: bool
    batch_id: str | None
    started_at: datetime
    finished_at: datetime
    messages_seen: int | None


class DeliveryRow(TypedDict, total=False):
    """A webhook delivery's columns; `now` with a take, the dead letter's
    `namespace` with a listing."""

    id: int
    dead_letter_id: str
    state: str
    body: str
    attempts: int
    created_at: datetime
    next_attempt_at: datetime
    enqueued_at: datetime | None
    lease_until: datetime | None
    last_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None
    now: datetime
    namespace: str


class ClaimRow(TypedDict):
    """A claim's columns (`SELECT * FROM claims`)."""

    id: str
    signal_id: str
    fence: int
    run_id: str
    message_id: str
    state: str
    claimed_at: datetime
    lease_until: datetime
    ended_at: datetime | None
    owner: str | None


class ReceiptRow(TypedDict):
    """A receipt's columns (`SELECT * FROM receipts`)."""

    id: str
    signal_id: str
    claim_id: str
    namespace: str
    run_id: str
    message_id: str
    claimed_at: datetime
    consumed_at: datetime
    evidence: dict[str, Any]
    owner: str | None
