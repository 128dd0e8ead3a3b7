"""Use cases of expiry and the dead-letter queue.

Expiry and its dead-letter record are written in one transaction, so none is
lost between them; publishing to the `dead_letter` Celery queue happens after
commit and is repaired by the sweep (an outbox).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection

from app.db import checks as checks_db
from app.db import dead_letters as dead_letters_db
from app.db import due as due_db
from app.db import messages as messages_db
from app.db import signals as signals_db
from app.db.engine import autocommit, transaction
from app.domain.diagnosis import Diagnosis, NearMiss, recommend
from app.domain.expectations import duplicate_sentence
from app.domain.ids import new_id
from app.domain.masking import mask_subject
from app.domain.refusals import Refusal
from app.domain.states import CheckOutcome, ExpiryReason, Status
from app.infra import dispatch
from app.observability.logs import signal_extra
from app.settings import Settings, get_settings
from app.usecases import refusals, views, webhooks

log = logging.getLogger("signalbox.expiry")

# Records the recipient typos of an expired signal (its row) as its near misses.
TypoLook = Callable[[Connection, Settings, Mapping[Any, Any]], object]


def expire_signal(
    session: Connection,
    signal_id: str,
    *,
    expected: Status,
    reason: str,
    fence: int | None = None,
    duplicates: Mapping[str, Any] | None = None,
    typo_look: TypoLook | None = None,
) -> str | None:
    """`expected` → expired with `reason` and its dead letter, in the caller's
    transaction. Returns the new dead letter's id, or None if the signal had
    already moved (someone else expired or found it first). `duplicates`
    (reason `duplicate_messages`): both messages and how far apart they came.
    `typo_look` (the checks pass `app.usecases.checks.recipient_typos`'s):
    run once the signal is expired, before its dead letter is written, so its
    near misses are in the dead letter's diagnosis."""
    row = signals_db.signal_expire(
        session, signal_id, expected=expected.value, reason=reason, fence=fence
    )
    if row is None:
        return None
    return _record_dead_letter(session, row, reason, duplicates, typo_look)


def _record_dead_letter(
    session: Connection,
    row: Mapping[Any, Any],
    reason: str,
    duplicates: Mapping[str, Any] | None,
    typo_look: TypoLook | None,
) -> str | None:
    signal_id = row["id"]
    counts = checks_db.check_counts_by_outcome(session, [signal_id]).get(signal_id, {})
    by_outcome = {o.value: counts.get(o.value, 0) for o in CheckOutcome}
    if typo_look is not None and reason != ExpiryReason.CLAIMS_EXHAUSTED:
        _look(
            session,
            lambda: typo_look(session, get_settings(), row),
            "recipient typos could not be looked for",
            "typo_look_failed",
            signal_id,
        )
    near = [
        NearMiss(
            message_id=n["message_id"],
            received_at=n["received_at"],
            subject=n["subject"],
            why=n["why"],
            run_marker=n["run_marker"],
            also=tuple(n["also"] or ()),
            recipient=row["recipient"] if n["address"] else None,
            address=n["address"],
        )
        for n in messages_db.near_miss_list(session, signal_id)
    ]
    sentence = recommend(
        Diagnosis(
            reason=reason,
            provider=row["provider"],
            received_after=row["received_after"],
            checks_by_outcome=by_outcome,
            last_error_code=row["last_error_code"],
            near_misses=near,
            subject_contains=row["subject_contains"],
            refusal=_refusal(session, row, reason),
            recipient=row["recipient"],
        )
    )
    if reason == ExpiryReason.DUPLICATE_MESSAGES and duplicates is not None:
        sentence = duplicate_sentence(float(duplicates["seconds_apart"]), row["settle_seconds"])
    dead_letter_id = dead_letters_db.dead_letter_insert(
        session,
        {
            "id": new_id("dlq"),
            "signal_id": signal_id,
            "generation": row["generation"],
            "namespace": row["namespace"],
            "run_id": row["run_id"],
            "provider": row["provider"],
            "reason": reason,
            "checks_total": sum(by_outcome.values()),
            "checks_by_outcome": by_outcome,
            "last_error_code": row["last_error_code"],
            "near_misses": [_near_miss_json(n) for n in near],
            "recommendation": sentence,
            "duplicates": dict(duplicates) if duplicates is not None else None,
        },
    )
    webhooks.delivery_record(session, dead_letter_id)  # same transaction: none lost
    log.info(
        "signal expired",
        extra=signal_extra(
            "signal_expired",
            row["run_id"],
            signal_id,
            row["recipient"],
            reason=reason,
            dead_letter_id=dead_letter_id,
        ),
    )
    return dead_letter_id


def _refusal(session: Connection, row: Mapping[Any, Any], reason: str) -> Refusal | None:
    """The sink's refusal of a delivery to the signal's recipient in its window."""
    if reason == ExpiryReason.CLAIMS_EXHAUSTED:
        return None
    return _look(
        session,
        lambda: refusals.refusal_for_signal(session, row),
        "refused deliveries could not be looked for",
        "refusal_look_failed",
        row["id"],
    )


T = TypeVar("T")


def _look(
    session: Connection, look: Callable[[], T], message: str, event: str, signal_id: str
) -> T | None:
    """Run a look that adds to a dead letter in a savepoint: a failed look is
    logged (`message`, `event`) and gives None; it never costs the dead letter."""
    try:
        with session.begin_nested():
            return look()
    except Exception as exc:
        log.warning(
            message, extra={"event": event, "signal_id": signal_id, "error": type(exc).__name__}
        )
        return None


def _near_miss_json(n: NearMiss) -> dict[str, Any]:
    out: dict[str, Any] = {
        "message_id": n.message_id,
        "received_at": views.iso(n.received_at),
        "subject": mask_subject(n.subject or ""),
        "why": n.why,
        "also": list(n.also),
    }
    if n.address:
        out["address"] = n.address
    return out


def publish(dead_letter_ids: list[str]) -> None:
    """Send new dead letters to the `dead_letter` queue, then mark them sent."""
    sent = [d for d in dead_letter_ids if d and dispatch.publish_dead_letter(d)]
    if sent:
        with transaction() as session:
            dead_letters_db.dead_letter_mark_published(session, sent)


def expire_overdue(
    limit: int = 500,
    *,
    grace_seconds: float = 60.0,
    typo_look: TypoLook | None = None,
    sink_providers: Sequence[str] = (),
) -> int:
    """Expire waiting signals past their deadline (reason `deadline`) whose
    final look ran, or was lost `grace_seconds` ago (no worker took it; for
    `sink_providers`, not while the sink holds mail to the address in the
    window: see `due_db.signal_ids_past_deadline`).
    An `expect: none` signal whose final look found nothing is `absent`
    instead (the expectation held: no dead letter). `typo_look`: as for
    `expire_signal`."""
    created: list[str] = []
    with transaction() as session:
        for signal_id in due_db.signal_absent_past_deadline(session, limit):
            log.info("signal absent", extra={"event": "signal_absent", "signal_id": signal_id})
        for signal_id in due_db.signal_ids_past_deadline(
            session, limit, grace_seconds, sink_providers
        ):
            dlq = expire_signal(
                session, signal_id, expected=Status.WAITING, reason="deadline", typo_look=typo_look
            )
            if dlq:
                created.append(dlq)
    publish(created)
    return len(created)


def republish_unsent(lease_seconds: float = 30.0, limit: int = 200) -> int:
    """The outbox sweep: dead letters committed but never published (their
    creator died or the broker refused), each taken under a lease."""
    with transaction() as session:
        ids = dead_letters_db.dead_letter_take_unpublished(
            session, lease_seconds=lease_seconds, limit=limit
        )
    publish(ids)
    return len(ids)


def resend_unalerted(after_seconds: float = 120.0, limit: int = 200) -> int:
    """Dead letters published `after_seconds` ago and still not alerted are
    sent again (their consumer alerts once, however often it is delivered);
    see `dead_letters_db.dead_letter_take_unalerted` for the pace. Its one
    statement commits alone: the sweep makes it every second."""
    with autocommit() as session:
        ids = dead_letters_db.dead_letter_take_unalerted(
            session, after_seconds=after_seconds, limit=limit
        )
    if ids:
        log.warning(
            "dead letters published but not alerted are sent again",
            extra={"event": "dead_letters_resent", "count": len(ids)},
        )
    publish(ids)
    return len(ids)
