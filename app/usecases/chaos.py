"""Chaos on the sink (docs/api.md, "Chaos"): a namespace's rules that make
the SMTP sink refuse `RCPT TO` or `DATA` for its own addresses, and the
sink's side of them.

A namespace sets rules only for addresses it owns or holds (an exact
address it may use, or `*@domain` for a domain it owns); rules end after
`SIGNALBOX_CHAOS_MAX_SECONDS` at the latest. The rules live in PostgreSQL,
and applying one is one guarded update, so `times` holds across every sink
process. The sink holds the live rules in memory and asks PostgreSQL only
when a rule covers the address at hand: with no rules, an SMTP command costs
no database round trip. A version in Redis, bumped by every change, tells
the sink at once that its copy is stale.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from app.db import chaos as chaos_db
from app.db.engine import autocommit, transaction
from app.domain.chaos import (
    ChaosRule,
    ChaosStage,
    data_rules_at_rcpt,
    data_rules_whole,
    is_valid_reply,
    pattern_matches,
    rules_for,
)
from app.domain.ids import new_id
from app.errors import RecipientNotOwned
from app.infra.keys import recipient_hash
from app.infra.redis import client_for, is_redis_url, redis_url
from app.settings import Settings
from app.usecases import views
from app.usecases.holds import hold_for_rule
from app.usecases.inputs import _Input, normalise_address

log = logging.getLogger("signalbox.chaos")

VERSION_KEY = "signalbox:chaos:version"
# How long the sink waits for the version before it goes by the copy's age.
VERSION_TIMEOUT_SECONDS = 0.5
MAX_RULES = 100
_DOMAIN = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$"
)


class ChaosRuleIn(_Input):
    """One rule: `recipient` an address or `*@domain`; `times` or `probability`."""

    recipient: str = Field(max_length=320)
    stage: Literal["rcpt", "data"]
    reply: str = Field(max_length=512)
    times: int | None = Field(default=None, ge=1, le=1_000_000)
    probability: float | None = Field(default=None, gt=0, le=1)
    expires_in_seconds: int | None = Field(default=None, ge=1)

    @field_validator("recipient")
    @classmethod
    def _recipient(cls, value: str) -> str:
        value = value.strip()
        if value.startswith("*@"):
            domain = value[2:].lower()
            if len(domain) > 253 or not _DOMAIN.match(domain):
                raise ValueError("must be an email address or *@domain")
            return "*@" + domain
        return normalise_address(value)

    @field_validator("reply")
    @classmethod
    def _reply(cls, value: str) -> str:
        if not is_valid_reply(value):
            raise ValueError(
                "must be one SMTP reply line with a 4xx or 5xx code, e.g. "
                "'451 4.3.0 Try again later' (printable ASCII, no CR or LF)"
            )
        return value

    @model_validator(mode="after")
    def _times_or_probability(self) -> ChaosRuleIn:
        if (self.times is None) == (self.probability is None):
            raise ValueError("give exactly one of times and probability")
        return self


class ChaosPut(_Input):
    rules: list[ChaosRuleIn] = Field(max_length=MAX_RULES)


def rule_view(row: Any) -> dict[str, Any]:
    return {
        "rule_id": row["id"],
        "recipient": row["recipient"],
        "stage": row["stage"],
        "reply": row["reply"],
        "times": row["times"],
        "probability": row["probability"],
        "applied": row["applied"],
        "created_at": views.iso(row["created_at"]),
        "expires_at": views.iso(row["expires_at"]),
    }


def chaos_put(settings: Settings, namespace: str, req: ChaosPut) -> dict[str, Any]:
    """Replace the namespace's rules; 403 `recipient_not_owned` (nothing
    changed) when one names an address or a domain it may not use."""
    owned_domains = {d for d, ns in settings.namespace_domain_owners.items() if ns == namespace}
    longest = settings.chaos_max_seconds
    with transaction() as session:
        for i, rule in enumerate(req.rules):
            if rule.recipient.startswith("*@"):
                allowed = rule.recipient[2:] in owned_domains
            else:
                allowed = hold_for_rule(settings, session, namespace, rule.recipient)
            if not allowed:
                raise RecipientNotOwned(
                    "a chaos rule may name only an address this namespace owns or holds, "
                    "or *@ a domain it owns",
                    field=f"rules.{i}.recipient",
                )
        rows = chaos_db.chaos_rule_replace(
            session,
            namespace,
            [
                {
                    "id": new_id("chs"),
                    "recipient": r.recipient,
                    "stage": r.stage,
                    "reply": r.reply,
                    "times": r.times,
                    "probability": r.probability,
                    "expires_in": float(min(r.expires_in_seconds or longest, longest)),
                }
                for r in req.rules
            ],
        )
        answer = {"rules": [rule_view(r) for r in rows]}
    _changed(settings)
    log.info(
        "chaos rules set",
        extra={
            "event": "chaos_rules_set",
            "namespace": namespace,
            "count": len(rows),
            "recipient_hashes": [
                r.recipient if r.recipient.startswith("*@") else recipient_hash(r.recipient)
                for r in req.rules
            ],
        },
    )
    return answer


def chaos_get(namespace: str) -> dict[str, Any]:
    with transaction() as session:
        return {"rules": [rule_view(r) for r in chaos_db.chaos_rule_list(session, namespace)]}


def chaos_delete(settings: Settings, namespace: str) -> dict[str, Any]:
    """Remove the namespace's rules; answers them as they ended (their counts)."""
    with transaction() as session:
        ended = [rule_view(r) for r in chaos_db.chaos_rule_list(session, namespace)]
        chaos_db.chaos_rule_delete(session, namespace)
    _changed(settings)
    log.info(
        "chaos rules deleted",
        extra={"event": "chaos_rules_deleted", "namespace": namespace, "count": len(ended)},
    )
    return {"rules": [], "deleted": ended}


def _changed(settings: Settings) -> None:
    """Tell every sink its rules are stale (after the commit). Best effort:
    without Redis a sink re-reads its rules every SinkChaos.FALLBACK_SECONDS."""
    url = redis_url(settings)
    if not is_redis_url(url):
        return
    try:
        client_for(url).incr(VERSION_KEY)
    except Exception as exc:
        log.warning(
            "chaos rules changed but the sinks could not be told at once",
            extra={"event": "chaos_version_failed", "error": type(exc).__name__},
        )


# --------------------------------------------------------------------------- the sink's side


def version_of(value: object) -> bytes:
    """The rules' version as read from Redis (never set yet: b"0")."""
    return value if isinstance(value, bytes) else b"0"


class SinkChaos:
    """The sink's copy of the live rules, and the one question it asks:
    which reply, if any, answers this command instead of the sink.

    The copy is brought up to date once per SMTP transaction (from its MAIL
    FROM on): the version in Redis is read (one round trip; the sink reads it
    on its event loop and calls `is_current`), and the rules are re-read from
    PostgreSQL (`reload`, blocking: the sink calls it in a thread) only when
    the version changed or the copy is older than `MAX_AGE_SECONDS` (a rule's
    end, a lost version bump); without Redis, when the copy is older than
    `FALLBACK_SECONDS`. `refresh()` does both in the calling thread.
    `reply_for()` asks PostgreSQL only when a held rule covers an address.
    Thread-safe.
    """

    MAX_AGE_SECONDS = 5.0
    FALLBACK_SECONDS = 1.0

    def __init__(
        self,
        settings: Settings,
        *,
        rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._rand = rand
        self._clock = clock
        self._lock = threading.Lock()
        self._rules: tuple[ChaosRule, ...] = ()
        self._version: bytes | None = None
        self._loaded_at: float | None = None

    @property
    def rules(self) -> tuple[ChaosRule, ...]:
        return self._rules

    @property
    def version_url(self) -> str | None:
        """The Redis that holds the rules' version, or None (the broker is
        not Redis: the copy is re-read by age alone)."""
        url = redis_url(self.settings)
        return url if is_redis_url(url) else None

    def refresh(self) -> None:
        """Bring the copy up to date if it may be stale (see the class)."""
        version = self._read_version()
        if not self.is_current(version):
            self.reload(version)

    def is_current(self, version: bytes | None) -> bool:
        """Whether the copy is that of `version` (None: unknown) and young
        enough to keep: no database read needed."""
        now = self._clock()
        with self._lock:
            age = None if self._loaded_at is None else now - self._loaded_at
            limit = self.MAX_AGE_SECONDS if version is not None else self.FALLBACK_SECONDS
            return age is not None and age < limit and version == self._version

    def reload(self, version: bytes | None) -> None:
        """Re-read the live rules from PostgreSQL as those of `version`; on
        a failure keep the last copy (the sink keeps working)."""
        now = self._clock()
        try:
            with autocommit() as session:
                rows = chaos_db.chaos_rule_live(session)
        except Exception as exc:  # the sink keeps working on its last copy
            log.warning(
                "chaos rules could not be read; keeping the last copy",
                extra={"event": "chaos_rules_unreadable", "error": type(exc).__name__},
            )
            return
        rules = tuple(
            ChaosRule(
                rule_id=r["id"],
                recipient=r["recipient"],
                stage=ChaosStage(r["stage"]),
                reply=r["reply"],
                expires_at=r["expires_at"],
                times=r["times"],
                probability=r["probability"],
                exhausted=bool(r["exhausted"]),
                namespace=r["namespace"],
            )
            for r in rows
        )
        with self._lock:
            self._rules, self._version, self._loaded_at = rules, version, now

    def _read_version(self) -> bytes | None:
        url = self.version_url
        if url is None:
            return None
        try:
            value = client_for(url, timeout=VERSION_TIMEOUT_SECONDS).get(VERSION_KEY)
        except Exception:
            return None
        return version_of(value)

    def reply_for(self, stage: ChaosStage, addresses: Sequence[str]) -> str | None:
        """The reply of the first live rule of `stage` covering one of
        `addresses` that applies now (a `probability` rule when its draw says
        so, a `times` rule while it has times left), counted applied; else None.
        A DATA rule answers DATA only when every recipient is its namespace's."""
        now = datetime.now(UTC)
        if stage is ChaosStage.DATA:
            candidates = data_rules_whole(self._rules, addresses, now)
        else:
            candidates = rules_for(self._rules, stage, addresses, now)
        return self._apply_first(candidates, stage)

    def data_reply_at_rcpt(self, address: str, earlier: Sequence[str]) -> str | None:
        """The reply of a DATA rule covering `address` that acts at its RCPT
        (the transaction already carries another tenant's recipient), counted
        applied; else None."""
        candidates = data_rules_at_rcpt(self._rules, address, earlier, datetime.now(UTC))
        return self._apply_first(candidates, ChaosStage.RCPT)

    def data_own_recipients(self, addresses: Sequence[str]) -> list[str]:
        """At DATA of a transaction that also carries other tenants'
        recipients: the recipients a DATA rule (applied now, counted) keeps
        the message from, as if it had refused them at RCPT; the message is
        stored for the others."""
        now = datetime.now(UTC)
        whole = {r.rule_id for r in data_rules_whole(self._rules, addresses, now)}
        dropped: list[str] = []
        for rule in rules_for(self._rules, ChaosStage.DATA, addresses, now):
            own = [a for a in addresses if pattern_matches(rule.recipient, a)]
            if rule.rule_id in whole or not set(own) - set(dropped):
                continue
            if self._apply_first([rule], ChaosStage.DATA) is not None:
                dropped.extend(a for a in own if a not in dropped)
        return dropped

    def _apply_first(self, candidates: Sequence[ChaosRule], stage: ChaosStage) -> str | None:
        if not candidates:
            return None
        for rule in candidates:
            if rule.probability is not None and self._rand() >= rule.probability:
                continue
            try:
                with transaction() as session:
                    reply = chaos_db.chaos_rule_apply(session, rule.rule_id)
            except Exception as exc:  # a fault injector that fails lets the mail through
                log.warning(
                    "a chaos rule could not be applied",
                    extra={"event": "chaos_apply_failed", "error": type(exc).__name__},
                )
                return None
            if reply is not None:
                log.info(
                    "chaos rule applied",
                    extra={"event": "chaos_applied", "rule_id": rule.rule_id, "stage": stage.value},
                )
                return reply
            self._mark_exhausted(rule.rule_id)
        return None

    def _mark_exhausted(self, rule_id: str) -> None:
        with self._lock:
            self._rules = tuple(
                replace(r, exhausted=True) if r.rule_id == rule_id else r for r in self._rules
            )
