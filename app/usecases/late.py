"""Late mail: a matching message that arrives after its signal expired.

Nobody else tells an SRE "your deadline is 12 s too short". For a day after
a signal's deadline, while its dead letter is open, the provider is searched
now and then (`SIGNALBOX_LATE_WATCH_INTERVAL_SECONDS`) for mail that
matches the signal; the first one found is linked to the dead letter as its
`late_message` and the recommendation says so. The message is not taken:
the signal stays expired until an operator redrives it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from app.db import dead_letters as dead_letters_db
from app.db import messages as messages_db
from app.db.engine import transaction
from app.domain.diagnosis import Diagnosis, NearMiss, recommend
from app.domain.matching import pick
from app.domain.ownership import sees
from app.domain.states import CheckOutcome
from app.settings import Settings
from app.usecases import checks, views
from app.usecases.visibility import belonging

log = logging.getLogger("signalbox.late")

WATCH_LIMIT = 200


def watched_providers() -> list[str]:
    with transaction() as session:
        return dead_letters_db.dead_letter_late_providers(session)


def find_late_mail(
    settings: Settings, provider_name: str, *, provider_for: Any, breaker_for: Any
) -> int:
    """Search `provider_name` once for the late mail of its watched dead
    letters; return how many got a late message."""
    with transaction() as session:
        watched = list(dead_letters_db.dead_letter_late_watch(session, provider_name, WATCH_LIMIT))
    if not watched:
        return 0
    provider, _ = checks.provider_or_error(provider_for, provider_name)
    if provider is None:
        return 0
    precision = getattr(provider, "timestamp_precision", timedelta(0))
    # Late mail is what came after each signal's deadline (not after its
    # expiry was written, up to a sweep later); no near-miss lookback.
    query = checks.search_query(watched, precision, opens="expires_at", lookback=timedelta(0))
    answer = checks.ask_provider(provider, breaker_for, query)
    if answer.outcome is not CheckOutcome.NO_MATCH or not answer.messages:
        return 0
    linked = 0
    with transaction() as session:
        observed = checks.record_messages(session, provider_name, answer.messages)
        belongs = belonging(
            session,
            settings,
            (
                (o.message_id, o.message.received_at, o.delivered_to, o.message.auth_namespace)
                for o in observed
            ),
        )
        for w in watched:
            mine = [o for o in observed if sees(w["namespace"], belongs[o.message_id])]
            if mine and _link(session, w, mine, precision, settings.match_text_max_bytes):
                linked += 1
    return linked


def _link(
    session: Connection,
    w: Any,
    observed: list[checks.Observed],
    precision: timedelta,
    text_max_bytes: int,
) -> bool:
    # Only mail after the deadline is late; mail up to it was the last look's.
    criteria = checks.criteria_for(
        w,
        precision,
        received_after=max(w["received_after"], w["expires_at"]),
        text_max_bytes=text_max_bytes,
    )
    horizon = w["expires_at"] + timedelta(hours=24)
    taken = messages_db.message_taken(session, [o.message_id for o in observed], w["namespace"])
    in_time = [o for o in observed if o.message.received_at <= horizon]
    result = pick(criteria, checks.candidates_for(in_time, lambda mid: mid in taken))
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
                    also=tuple(n.get("also") or ()),
                    recipient=w["recipient"] if n.get("address") else None,
                    address=n.get("address"),
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
