"""The schema. Constraints here carry the contract's guarantees:

- one signal per live idempotency key: `idempotency_keys` primary key;
- a message satisfies at most one signal per namespace: unique
  (`signals.namespace`, `signals.message_id`) among signals that took it
  (an `arrived` signal, which expected no email, shows its message but
  never takes it);
- every observed message once: unique (provider, provider_message_id);
- one check row per check lease: unique (signal_id, fence) on `checks`;
- at most one active claim per signal, one receipt per signal;
- one dead letter per expiry: unique (signal_id, generation);
- an enumerated column holds only a value the code knows: a CHECK per column
  of `ENUMERATED` (`ck_<table>_<column>`), its values taken from the enums of
  `app.domain` (migration 0009).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from app.db.model_base import ENUMERATED, OTHER_CHECKS, Base, Key, Name, Stamped, one_of, partial

__all__ = ["ENUMERATED", "OTHER_CHECKS", "Base"]


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    namespace: Mapped[Name]
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[Stamped]


class Mailbox(Base):
    __tablename__ = "mailboxes"
    id: Mapped[Key]
    namespace: Mapped[Name]
    run_id: Mapped[Name]
    provider: Mapped[Name]
    address: Mapped[str] = mapped_column(String(320), unique=True)
    created_at: Mapped[Stamped]
    expires_at: Mapped[datetime]
    deleted_at: Mapped[datetime | None]
    __table_args__ = (Index(None, "namespace", "run_id"),)


class AddressHold(Base):
    """One episode of a namespace holding an address nobody owns; the open
    one (released_at NULL) is unique per address (app.domain.ownership)."""

    __tablename__ = "address_holds"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    address: Mapped[str] = mapped_column(String(320))
    namespace: Mapped[Name]
    held_from: Mapped[datetime]
    released_at: Mapped[datetime | None]
    __table_args__ = (
        Index(None, "address", "held_from"),
        partial("ix_address_holds_open", "address", where="released_at IS NULL", unique=True),
    )


class SinkMessage(Base):
    """What the built-in SMTP sink received: the `sink` provider's mailbox."""

    __tablename__ = "sink_messages"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    received_at: Mapped[Stamped]
    mail_from: Mapped[str | None] = mapped_column(Text)
    envelope_recipients: Mapped[list[str]] = mapped_column(ARRAY(Text))
    # Envelope, To and Cc, lower-cased: what recipient matching looks at.
    all_recipients: Mapped[list[str]] = mapped_column(ARRAY(Text))
    size: Mapped[int] = mapped_column(Integer)
    # Stored compressed (TOAST, lz4 where the server has it: migration 0016).
    raw: Mapped[bytes] = mapped_column(LargeBinary)
    auth_namespace: Mapped[Name | None]  # SMTP AUTH's (0019)
    message_id: Mapped[str | None] = mapped_column(String(40), unique=True)  # msg_: 0021
    __table_args__ = (
        # No pending list: every look searches it, and searches read a
        # pending list in full (migration 0006).
        Index(
            None, "all_recipients", postgresql_using="gin", postgresql_with={"fastupdate": "off"}
        ),
        Index(None, "received_at"),
    )


class Message(Base):
    """A message observed at a provider, recorded once whatever the retries."""

    __tablename__ = "messages"
    id: Mapped[Key]
    provider: Mapped[Name]
    provider_message_id: Mapped[str] = mapped_column(String(512))
    received_at: Mapped[datetime]
    observed_at: Mapped[Stamped]
    subject: Mapped[str] = mapped_column(Text, server_default="")
    recipients: Mapped[list[str]] = mapped_column(ARRAY(Text))
    run_marker: Mapped[str | None] = mapped_column(String(256))
    size: Mapped[int] = mapped_column(Integer, server_default="0")
    # The recipients it belongs by (ownership): the envelope's where the
    # provider knows it, else To and Cc; NULL (rows from before): `recipients`.
    delivered_to: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    # A line of the raw message ended in a bare LF (kept as received).
    bare_lf: Mapped[bool] = mapped_column(Boolean, server_default="false")
    auth_namespace: Mapped[Name | None]  # SMTP AUTH's (0019)
    # Purged (NULL) with its mailbox or by the inbox; compressed as above (0016).
    raw: Mapped[bytes | None] = mapped_column(LargeBinary)
    from_addr: Mapped[str | None] = mapped_column(Text)  # to read_at: the inbox's (0021)
    to_addrs: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    cc_addrs: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    header_message_id: Mapped[str | None] = mapped_column(Text)
    attachments: Mapped[int] = mapped_column(Integer, server_default="0")
    words: Mapped[str | None] = mapped_column(TSVECTOR)
    read_at: Mapped[datetime | None]
    __table_args__ = (
        UniqueConstraint("provider", "provider_message_id"),
        Index(None, "provider", "received_at"),
        Index(None, "recipients", postgresql_using="gin"),
        Index(None, "received_at", "id"),  # the inbox: newest first
        Index(None, "header_message_id"),
        Index(None, "from_addr"),
        Index(None, "words", postgresql_using="gin"),
    )


class Signal(Base):
    __tablename__ = "signals"
    id: Mapped[Key]
    namespace: Mapped[Name]
    idempotency_key: Mapped[str] = mapped_column(String(512))
    run_id: Mapped[Name]
    test_case: Mapped[str] = mapped_column(String(200))
    recipient: Mapped[str] = mapped_column(String(320))
    subject_contains: Mapped[str | None] = mapped_column(Text)
    body_contains: Mapped[str | None] = mapped_column(Text)
    received_after: Mapped[datetime]
    created_at: Mapped[Stamped]
    updated_at: Mapped[Stamped]
    expires_at: Mapped[datetime]
    max_checks: Mapped[int] = mapped_column(Integer)
    provider: Mapped[Name]
    require_run_marker: Mapped[bool] = mapped_column(Boolean, server_default="false")
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default="{}")
    status: Mapped[str] = mapped_column(String(16), server_default="waiting")
    expiry_reason: Mapped[str | None] = mapped_column(String(32))
    expired_at: Mapped[datetime | None]
    # Bumped by each redrive; dead letters are unique per generation.
    generation: Mapped[int] = mapped_column(Integer, server_default="1")
    # Checks that count against max_checks (circuit_open ones do not).
    checks_count: Mapped[int] = mapped_column(Integer, server_default="0")
    # Counts by outcome of check rows retention deleted (evidence keeps them).
    checks_archived: Mapped[dict[str, int]] = mapped_column(JSONB, server_default="{}")
    consecutive_errors: Mapped[int] = mapped_column(Integer, server_default="0")
    next_check_at: Mapped[datetime | None]
    next_check_reason: Mapped[str] = mapped_column(String(16), server_default="first")
    enqueued_at: Mapped[datetime | None]
    # Check lease and its fencing number: a check's result is written only if
    # the fence it took is still the signal's.
    check_fence: Mapped[int] = mapped_column(BigInteger, server_default="0")
    check_lease_until: Mapped[datetime | None]
    last_check_at: Mapped[datetime | None]
    # When the latest check's look at the provider began: the deadline
    # expires a signal only after a look at or after it.
    last_look_at: Mapped[datetime | None]
    last_outcome: Mapped[str | None] = mapped_column(String(16))
    last_error_code: Mapped[str | None] = mapped_column(String(64))
    message_id: Mapped[str | None] = mapped_column(
        ForeignKey("messages.id", ondelete="SET NULL"), index=True
    )
    found_at: Mapped[datetime | None]
    # Claim fencing number: increases at every claim.
    claim_fence: Mapped[int] = mapped_column(BigInteger, server_default="0")
    claims_used: Mapped[int] = mapped_column(Integer, server_default="0")
    max_claims: Mapped[int] = mapped_column(Integer, server_default="3")
    # What the signal asserts (`first`, `exactly_one`, `none`) and, for
    # `exactly_one`, how long a second match is waited for (migration 0013).
    expect: Mapped[str] = mapped_column(String(16), server_default="first")
    settle_seconds: Mapped[int | None] = mapped_column(SmallInteger)
    cancel_reason: Mapped[str | None] = mapped_column(String(200))  # 1-200 chars (0020)
    cancelled_at: Mapped[datetime | None]
    __table_args__ = (
        # One message per signal within a namespace; namespaces match shared
        # mail independently. An `arrived` signal shows its message without
        # taking it.
        partial(
            "uq_signals_namespace_message_id",
            "namespace",
            "message_id",
            where="status <> 'arrived'",
            unique=True,
        ),
        *one_of(
            "signals", "status", "expiry_reason", "next_check_reason", "last_outcome", "expect"
        ),
        Index(None, "namespace", "run_id", "created_at"),
        partial("ix_signals_due", "next_check_at", where="status = 'waiting'"),
        partial(
            "ix_signals_waiting_recipient", "provider", "recipient", where="status = 'waiting'"
        ),
        partial("ix_signals_waiting_namespace", "namespace", where="status = 'waiting'"),
        # A hold's lapse is judged from its namespace's signals on the address.
        Index(None, "recipient", "namespace"),
        partial("ix_signals_waiting_deadline", "expires_at", where="status = 'waiting'"),
    )


class IdempotencyKey(Base):
    """One live key per namespace: the database, not the code, makes
    concurrent identical creates yield one signal."""

    __tablename__ = "idempotency_keys"
    namespace: Mapped[Name] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(512), primary_key=True)
    signal_id: Mapped[str] = mapped_column(ForeignKey("signals.id", ondelete="CASCADE"))
    expires_at: Mapped[datetime]


class Check(Base):
    __tablename__ = "checks"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    signal_id: Mapped[str] = mapped_column(ForeignKey("signals.id", ondelete="CASCADE"))
    generation: Mapped[int] = mapped_column(Integer)
    fence: Mapped[int] = mapped_column(BigInteger)
    provider: Mapped[Name]
    reason: Mapped[str] = mapped_column(String(16))
    outcome: Mapped[str] = mapped_column(String(16))
    error_code: Mapped[str | None] = mapped_column(String(64))
    # Spent one of max_checks (only checks the schedule asked for do).
    counted: Mapped[bool] = mapped_column(Boolean, server_default="false")
    # One provider call may answer several signals' checks.
    batch_id: Mapped[str | None] = mapped_column(String(40))
    started_at: Mapped[datetime]
    finished_at: Mapped[Stamped]
    # Messages the provider call returned for this check; NULL when not recorded.
    messages_seen: Mapped[int | None] = mapped_column(Integer)
    __table_args__ = (
        UniqueConstraint("signal_id", "fence"),
        *one_of("checks", "reason", "outcome"),
        Index(None, "finished_at"),
    )


class NearMiss(Base):
    __tablename__ = "near_misses"
    signal_id: Mapped[str] = mapped_column(
        ForeignKey("signals.id", ondelete="CASCADE"), primary_key=True
    )
    message_id: Mapped[str] = mapped_column(
        ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True
    )
    why: Mapped[str] = mapped_column(String(32))
    # The other rules it failed, in the order of `why` (migration 0014).
    also: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default="{}")
    # For a recipient_typo: the address the message went to instead.
    address: Mapped[str | None] = mapped_column(String(320))
    recorded_at: Mapped[Stamped]
    __table_args__ = (*one_of("near_misses", "why"),)


class Claim(Base):
    __tablename__ = "claims"
    id: Mapped[Key]
    signal_id: Mapped[str] = mapped_column(ForeignKey("signals.id", ondelete="CASCADE"))
    fence: Mapped[int] = mapped_column(BigInteger)
    run_id: Mapped[Name]
    message_id: Mapped[str] = mapped_column(String(40))
    state: Mapped[str] = mapped_column(String(16), server_default="active")
    claimed_at: Mapped[Stamped]
    lease_until: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    # Who holds it (the claim's `owner`, default the token's name).
    owner: Mapped[str | None] = mapped_column(String(200))
    __table_args__ = (
        UniqueConstraint("signal_id", "fence"),
        *one_of("claims", "state"),
        partial("uq_claims_one_active", "signal_id", where="state = 'active'", unique=True),
        partial("ix_claims_active_lease", "lease_until", where="state = 'active'"),
    )


class NamespaceWaiting(Base):
    """How many signals of a namespace are waiting, in rows per backend
    shard, kept by the `signals_count_waiting` trigger (migration 0005);
    the sum of a namespace's rows is its count."""

    __tablename__ = "namespace_waiting"
    namespace: Mapped[Name] = mapped_column(primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    waiting: Mapped[int] = mapped_column(BigInteger, server_default="0")


class Receipt(Base):
    __tablename__ = "receipts"
    id: Mapped[Key]
    signal_id: Mapped[str] = mapped_column(String(40), unique=True)
    claim_id: Mapped[str] = mapped_column(String(40), unique=True)
    namespace: Mapped[Name]
    run_id: Mapped[Name]
    message_id: Mapped[str] = mapped_column(String(40))
    claimed_at: Mapped[datetime]
    consumed_at: Mapped[Stamped]
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB)
    owner: Mapped[str | None] = mapped_column(String(200))
    __table_args__ = (Index(None, "namespace", "run_id"),)


class DeadLetter(Base):
    __tablename__ = "dead_letters"
    id: Mapped[Key]
    signal_id: Mapped[str] = mapped_column(String(40))
    generation: Mapped[int] = mapped_column(Integer)
    namespace: Mapped[Name]
    run_id: Mapped[Name]
    provider: Mapped[Name]
    reason: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), server_default="open")
    created_at: Mapped[Stamped]
    checks_total: Mapped[int] = mapped_column(Integer)
    checks_by_outcome: Mapped[dict[str, int]] = mapped_column(JSONB)
    last_error_code: Mapped[str | None] = mapped_column(String(64))
    near_misses: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    recommendation: Mapped[str] = mapped_column(Text)
    note: Mapped[str | None] = mapped_column(Text)
    resolved_at: Mapped[datetime | None]
    # Matching mail that arrived after the deadline (within a day of it).
    late_message: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # `duplicate_messages`: both messages and how far apart they came.
    duplicates: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Set once the dead letter was sent to the `dead_letter` Celery queue; the
    # sweep re-sends any left NULL (outbox). `publish_attempt_at` leases a
    # publication so that two sweeps never send one dead letter twice.
    published_at: Mapped[datetime | None]
    publish_attempt_at: Mapped[datetime | None]
    # Set by the `dead_letter` queue's consumer when it raises the alert: a
    # dead letter published twice (the outbox re-sends one whose mark failed)
    # is alerted once.
    alerted_at: Mapped[datetime | None]
    __table_args__ = (
        UniqueConstraint("signal_id", "generation"),
        *one_of("dead_letters", "reason", "state"),
        Index(None, "namespace", "state", "created_at"),
        partial("ix_dead_letters_unpublished", "created_at", where="published_at IS NULL"),
        partial(
            "ix_dead_letters_unalerted",
            "published_at",
            where="alerted_at IS NULL AND published_at IS NOT NULL",
        ),
        partial(
            "ix_dead_letters_late_watch",
            "provider",
            "created_at",
            where="state = 'open' AND late_message IS NULL",
        ),
    )


class WebhookDelivery(Base):
    """The dead-letter webhook's outbox: one row per dead letter, inserted in
    the transaction that records the dead letter, so none is lost; delivered
    under a lease, its outcome written by a guarded update."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    dead_letter_id: Mapped[str] = mapped_column(
        ForeignKey("dead_letters.id", ondelete="CASCADE"), unique=True
    )
    # pending → delivered | failed (gave up after SIGNALBOX_WEBHOOK_RETRY_HOURS).
    state: Mapped[str] = mapped_column(String(16), server_default="pending")
    # The exact JSON sent at every attempt (the signature covers these bytes).
    body: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[Stamped]
    next_attempt_at: Mapped[Stamped]
    enqueued_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    last_attempt_at: Mapped[datetime | None]
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(String(200))
    delivered_at: Mapped[datetime | None]
    __table_args__ = (
        *one_of("webhook_deliveries", "state"),
        partial("ix_webhook_deliveries_due", "next_attempt_at", where="state = 'pending'"),
    )


# The tables of chaos rules, console sessions and refused deliveries: a module
# of their own (this one's size).
from app.db import models_more as _more  # noqa: E402, F401
