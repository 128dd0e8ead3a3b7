"""Late mail: a matching message that arrives after its signal expired.

Nobody else tells an SRE "your deadline is 12 s too short". For a day after
a signal's deadline, while its dead letter is open, the provider is looked
at now and then (`SIGNALBOX_LATE_WATCH_INTERVAL_SECONDS`) for mail that
matches the signal; the first one found is linked to the dead letter as its
`late_message` and the recommendation says so. The message is not taken:
the signal stays expired until an operator redrives it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from app.db import dead_letters as dead_letters_db
from app.db import messages as messages_db
from app.db.engine import transaction
from app.domain.diagnosis import Diagnosis, NearMiss, recommend
from app.domain.matching import Candidate, Criteria, floor_to, pick
from app.domain.ownership import may_use
from app.domain.states import CheckOutcome
from app.providers.base import SearchQuery
from app.settings import Settings
from app.usecases import checks, views

log = logging.getLogger("signalbox.late")

WATCH_LIMIT = 200


def watched_providers() -> list[str]:
    with transaction() as session:
        return dead_letters_db.dead_letter_late_providers(session)


def look(settings: Settings, provider_name: str, *, provider_for: Any, breaker_for: Any) -> int:
    """Look once at `provider_name` for the late mail of its watched dead
    letters; return how many got a late message."""
    with transaction() as session:
        watched = list(dead_letters_db.dead_letter_late_watch(session, provider_name, WATCH_LIMIT))
    if not watched:
        return 0
    provider, _ = checks.provider_or_error(provider_for, provider_name)
    if provider is None:
        return 0
    precision = getattr(provider, "timestamp_precision", timedelta(0))
    windows: dict[str, Any] = {}
    for w in watched:
        opens = floor_to(w["expired_at"].astimezone(UTC), precision)
        windows[w["recipient"]] = min(opens, windows.get(w["recipient"], opens))
    result = checks.ask_provider(
        provider,
        breaker_for,
        SearchQuery(since=min(windows.values()), recipients=frozenset(windows), windows=windows),
    )
    if result.outcome is not CheckOutcome.NO_MATCH or not result.messages:
        return 0
    linked = 0
    with transaction() as session:
        candidates = checks.record_messages(session, provider_name, result.messages)
        owners = checks.recipient_owners(session, settings, set(windows))
        for w in watched:
            if not may_use(w["namespace"], owners.get(w["recipient"])):
                continue
            if _link(session, w, candidates, precision):
                linked += 1
    return linked


def _link(session: Any, w: Any, candidates: list[Any], precision: timedelta) -> bool:
    criteria = Criteria(
        recipient=w["recipient"],
        run_id=w["run_id"],
        # Only mail after the signal expired is late; earlier mail was looked at.
        received_after=max(w["received_after"], w["expired_at"]),
        subject_contains=w["subject_contains"],
        body_contains=w["body_contains"],
        require_run_marker=w["require_run_marker"],
        precision=precision,
    )
    horizon = w["expires_at"] + timedelta(hours=24)
    taken = messages_db.message_taken(session, [mid for mid, _, _ in candidates], w["namespace"])
    result = pick(
        criteria,
        [
            Candidate(
                message_id=mid,
                received_at=m.received_at.astimezone(UTC),
                mail=parsed,
                envelope_recipients=tuple(a.lower() for a in m.envelope_recipients),
                taken_by_other=mid in taken,
            )
            for mid, m, parsed in candidates
            if m.received_at <= horizon
        ],
    )
    if result.winner is None:
        return False
    winner = result.winner
    after = (winner.received_at - w["expires_at"]).total_seconds()
    late = {
        "message_id": winner.message_id,
        "received_at": views.iso(winner.received_at),
        "seconds_after_deadline": round(after, 3),
    }
    sentence = recommend(
        Diagnosis(
            reason=w["reason"],
            provider=w["provider"],
            received_after=w["received_after"],
            checks_by_outcome=w["checks_by_outcome"] or {},
            last_error_code=w["last_error_code"],
            near_misses=[
                NearMiss(
                    message_id=n["message_id"],
                    received_at=datetime.fromisoformat(n["received_at"].replace("Z", "+00:00")),
                    subject=n.get("subject", ""),
                    why=n["why"],
                )
                for n in (w["near_misses"] or [])
            ],
            subject_contains=w["subject_contains"],
            late_seconds_after_deadline=after,
        )
    )
    if not dead_letters_db.dead_letter_set_late(session, w["id"], late, sentence):
        return False
    log.info(
        "late mail linked to its dead letter",
        extra={
            "event": "late_message",
            "dead_letter_id": w["id"],
            "signal_id": w["signal_id"],
            "run_id": w["run_id"],
            "seconds_after_deadline": round(after, 3),
        },
    )
    return True
