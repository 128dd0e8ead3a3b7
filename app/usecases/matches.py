"""A signal's matching messages: every message of its window that matches
its filters, oldest first, with the signal that took each
(`GET /v1/signals/{signal_id}/matches`).

The window is read when the request comes, not only as the signal's looks
left it: for the sink, from its store (a message no look recorded, such as
one that arrived after the signal was found, is recorded now, as a look
would, and listed); for a polled provider, from what its looks recorded
(the provider is not asked again), and the answer says which (`source`).

"Matches its filters" is every rule of the matcher but one: a message
another signal took is listed too, with `taken_by` naming that signal. Only
messages the signal's namespace may see are listed
(`app.usecases.visibility`). A message whose content was purged is listed
unless the signal filters on the body.

Memory is bounded by one message, not by the window: the summaries recorded
with each message (subject, recipients, run marker) decide every rule but
the body; a message's bytes are read, one message at a time, only to record
one no look recorded or to test a body filter, and parsed the way this
process's looks parse (in the parse pool, under its CPU budget).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from app.db import messages as messages_db
from app.db import signals as signals_db
from app.db import sink_window as sink_window_db
from app.db.engine import autocommit, transaction
from app.domain.mail import ParsedMail, parse_mail
from app.domain.masking import mask_subject
from app.domain.matching import Candidate, Criteria, Why, evaluate
from app.errors import NotFound
from app.providers.base import ProviderMessage
from app.providers.runtime import get_provider
from app.settings import Settings
from app.usecases import views
from app.usecases.checks.criteria import criteria_for
from app.usecases.checks.observed import Parser, record_messages
from app.usecases.visibility import visible_ids

# At most this many messages of the window are read for one answer.
WINDOW_LIMIT = 2000
# A provider that cannot be built here is read with whole-second stamps: the
# window then opens at the floor of its second, as a check of it would.
_UNKNOWN_PRECISION = timedelta(seconds=1)
# Where the window was read from (the answer's `source`).
SOURCE_STORE = "store"
SOURCE_LOOKS = "looks"


def _provider_facts(settings: Settings, provider: str) -> tuple[timedelta, bool]:
    """(stamp precision, whether its store is the sink's table)."""
    try:
        built = get_provider(settings, provider)
    except Exception:
        return _UNKNOWN_PRECISION, False
    return getattr(built, "timestamp_precision", timedelta(0)), getattr(built, "type", "") == "sink"


def _summary_mail(row: Mapping[Any, Any]) -> ParsedMail:
    """The message as the matcher reads it without its body: from the summary
    its recording kept (recipients, subject and run marker as parsed then)."""
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


def _record_store_window(
    provider: str, recipient: str, opens: datetime, closes: datetime, parse: Parser
) -> None:
    """Record the sink messages of the window that no look recorded, as a
    look would, one message (and one short transaction) at a time."""
    with autocommit() as session:
        unrecorded = sink_window_db.sink_message_unrecorded_in_window(
            session, recipient, opens=opens, closes=closes, recorded_by=provider, limit=WINDOW_LIMIT
        )
    for row in unrecorded:
        with transaction() as session:
            data = sink_window_db.sink_message_raw(session, int(row["id"]))
            if data is None:
                continue  # purged meanwhile
            message = ProviderMessage(
                provider_message_id=str(row["id"]),
                received_at=row["received_at"],
                raw=data,
                envelope_recipients=tuple(row["envelope_recipients"]),
                message_id=row["message_id"],
            )
            record_messages(session, provider, [message], parse=parse)
            del data, message


def _passes_without_body(criteria: Criteria, candidate: Candidate) -> bool:
    """Every rule but the body holds (decided from the summary alone)."""
    verdict = evaluate(criteria, candidate)
    return verdict.addressed and set(verdict.failures) <= {Why.BODY_MISMATCH}


def _body_matches(message_id: str, parse: Parser) -> ParsedMail | None:
    """The message parsed for a body filter (None once its content was purged)."""
    with autocommit() as session:
        row = messages_db.message_raw(session, message_id)
    if row is None or row["raw"] is None:
        return None
    return parse(bytes(row["raw"]))


def match_list(
    settings: Settings,
    namespace: str | None,
    signal_id: str,
    *,
    masked: bool = False,
    parse: Parser = parse_mail,
) -> dict[str, Any]:
    """`{"items", "source"}`: the signal's matching messages (`namespace`
    None: any namespace's signal, for operators, who get subjects `masked`;
    a body filter's messages parsed by `parse`, the API's parse pool's)."""
    with autocommit() as session:
        signal = signals_db.signal_get(session, signal_id, namespace)
    if signal is None:
        raise NotFound(f"no signal {signal_id}")
    precision, is_sink = _provider_facts(settings, signal["provider"])
    criteria = criteria_for(signal, precision)
    closes = signal["expires_at"]
    if is_sink:
        _record_store_window(
            signal["provider"], signal["recipient"], criteria.window_opens, closes, parse
        )
    with autocommit() as session:
        rows = messages_db.message_list_in_window(
            session,
            signal["provider"],
            signal["recipient"],
            opens=criteria.window_opens,
            closes=closes,
            limit=WINDOW_LIMIT,
        )
    needs_body = signal["body_contains"] is not None
    matching = []
    for r in rows:
        candidate = Candidate(
            message_id=r["id"],
            received_at=r["received_at"].astimezone(UTC),
            mail=_summary_mail(r),
            envelope_recipients=tuple(r["recipients"]),
        )
        if needs_body:
            if r["purged"] or not _passes_without_body(criteria, candidate):
                continue
            mail = _body_matches(r["id"], parse)
            if mail is None:
                continue
            candidate = dataclasses.replace(candidate, mail=mail)
        if evaluate(criteria, candidate).matched:
            matching.append(r)
    ids = [r["id"] for r in matching]
    with autocommit() as session:
        seen = visible_ids(session, settings, signal["namespace"], ids) if ids else set()
        taken = messages_db.message_taken(session, ids, signal["namespace"]) if ids else {}
    items = [
        {
            "message_id": r["id"],
            "received_at": views.iso(r["received_at"]),
            "subject": mask_subject(r["subject"] or "") if masked else r["subject"],
            "taken_by": taken.get(r["id"]),
        }
        for r in matching
        if r["id"] in seen
    ]
    return {"items": items, "source": SOURCE_STORE if is_sink else SOURCE_LOOKS}
