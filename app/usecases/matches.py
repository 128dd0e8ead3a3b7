"""A signal's matching messages: every message its checks recorded that
matches its filters in its window, oldest first, with the signal that took
each (`GET /v1/signals/{signal_id}/matches`).

"Matches its filters" is every rule of the matcher but one: a message
another signal took is listed too, with `taken_by` naming that signal. Only
messages the signal's namespace may see are listed
(`app.usecases.visibility`). A message whose content was purged is listed
unless the signal filters on the body.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, timedelta
from typing import Any

from app.db import messages as messages_db
from app.db import signals as signals_db
from app.db.engine import transaction
from app.domain.mail import ParsedMail, parse_mail
from app.domain.masking import mask_subject
from app.domain.matching import Candidate, evaluate
from app.errors import NotFound
from app.providers.runtime import get_provider
from app.settings import Settings
from app.usecases import views
from app.usecases.checks.criteria import criteria_for
from app.usecases.visibility import visible_ids

# At most this many recorded messages of the window are read for one answer.
WINDOW_LIMIT = 2000
# A provider that cannot be built here is read with whole-second stamps: the
# window then opens at the floor of its second, as a check of it would.
_UNKNOWN_PRECISION = timedelta(seconds=1)


def _precision(settings: Settings, provider: str) -> timedelta:
    try:
        return getattr(get_provider(settings, provider), "timestamp_precision", timedelta(0))
    except Exception:
        return _UNKNOWN_PRECISION


def _mail(row: Mapping[Any, Any], needs_body: bool) -> ParsedMail:
    """The message as the matcher reads it: parsed from its bytes when the
    signal filters on the body, else from the summary its check recorded
    (recipients, subject and run marker as parsed then): no parse per request."""
    if needs_body:
        return parse_mail(bytes(row["raw"]))
    return ParsedMail(
        subject=row["subject"] or "",
        to=(),
        cc=(),
        from_addr=None,
        message_id_header=None,
        run_marker=row["run_marker"],
        text="",
        html="",
    )


def match_list(
    settings: Settings, namespace: str | None, signal_id: str, *, masked: bool = False
) -> list[dict[str, Any]]:
    """The signal's matching messages (`namespace` None: any namespace's
    signal, for operators, who get subjects `masked`)."""
    with transaction() as session:
        signal = signals_db.signal_get(session, signal_id, namespace)
        if signal is None:
            raise NotFound(f"no signal {signal_id}")
        criteria = criteria_for(signal, _precision(settings, signal["provider"]))
        rows = messages_db.message_list_in_window(
            session,
            signal["provider"],
            signal["recipient"],
            opens=criteria.window_opens,
            closes=signal["expires_at"],
            limit=WINDOW_LIMIT,
        )
        needs_body = signal["body_contains"] is not None
        matching = [
            r
            for r in rows
            if (r["raw"] is not None or not needs_body)
            and evaluate(
                criteria,
                Candidate(
                    message_id=r["id"],
                    received_at=r["received_at"].astimezone(UTC),
                    mail=_mail(r, needs_body),
                    envelope_recipients=tuple(r["recipients"]),
                ),
            ).matched
        ]
        ids = [r["id"] for r in matching]
        seen = visible_ids(session, settings, signal["namespace"], ids) if ids else set()
        taken = messages_db.message_taken(session, ids, signal["namespace"]) if ids else {}
    return [
        {
            "message_id": r["id"],
            "received_at": views.iso(r["received_at"]),
            "subject": mask_subject(r["subject"] or "") if masked else r["subject"],
            "taken_by": taken.get(r["id"]),
        }
        for r in matching
        if r["id"] in seen
    ]
