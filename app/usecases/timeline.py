"""A signal's life, every event in order: created, each check, found, each
claim and how it ended (released, lapsed, consumed), each expiry and its
dead letter, each redrive or discard, late mail, a cancellation. The console's signal page
shows it; a tenant sees its own signals, an operator any."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.db import checks as checks_db
from app.db import claims as claims_db
from app.db import dead_letters as dead_letters_db
from app.db import signals as signals_db
from app.db.engine import transaction
from app.errors import NotFound
from app.usecases import views
from app.usecases.auth import Principal

# Checks shown per signal: the first ones of a long wait tell the least.
CHECKS_SHOWN = 500

# The event a claim's end is shown as, by the claim's state ("cancelled"
# alone is renamed: the signal's own cancellation is "cancelled").
_CLAIM_ENDED = {
    "released": "released",
    "lapsed": "lapsed",
    "consumed": "consumed",
    "cancelled": "claim_cancelled",
}


def signal_timeline(caller: Principal, signal_id: str) -> list[dict[str, Any]]:
    """`{"at", "event", "detail", "generation", "ref"}` per event, oldest first
    (ties keep the order a life runs in)."""
    with transaction() as session:
        signal = signals_db.signal_get(session, signal_id, caller.scope())
        if signal is None:
            raise NotFound(f"no signal {signal_id}")
        checks = checks_db.check_list(session, signal_id, after=None, limit=CHECKS_SHOWN)
        claims = claims_db.claim_list_for_signal(session, signal_id)
        dead = dead_letters_db.dead_letter_list_for_signal(session, signal_id)

    events: list[tuple[datetime, int, dict[str, Any]]] = []

    def add(at: datetime | None, rank: int, event: str, detail: str, **extra: Any) -> None:
        if at is not None:
            events.append(
                (at, rank, {"at": views.iso(at), "event": event, "detail": detail, **extra})
            )

    add(signal["created_at"], 0, "created", f"waiting on provider {signal['provider']}")
    for c in checks:
        detail = f"{c['reason']} check: {c['outcome'].replace('_', ' ')}"
        if c["error_code"]:
            detail += f" ({c['error_code']})"
        add(c["started_at"], 1, "check", detail, generation=c["generation"])
    if signal["found_at"] is not None and signal["message_id"]:
        add(signal["found_at"], 2, "found", "a message matched", ref=signal["message_id"])
    for cl in claims:
        lease = views.iso(cl["lease_until"])
        add(cl["claimed_at"], 3, "claimed", f"lease until {lease}", ref=cl["id"])
        if cl["state"] != "active":
            ended = _CLAIM_ENDED.get(cl["state"], cl["state"])
            add(cl["ended_at"], 4, ended, f"claim {cl['id']}", ref=cl["id"])
    for d in dead:
        add(
            d["created_at"],
            5,
            "expired",
            f"reason {d['reason']}; dead letter recorded",
            generation=d["generation"],
            ref=d["id"],
        )
        late = d["late_message"]
        if isinstance(late, dict) and late.get("received_at"):
            add(
                datetime.fromisoformat(str(late["received_at"]).replace("Z", "+00:00")),
                6,
                "late_message",
                f"{late.get('seconds_after_deadline')} s after the deadline",
                ref=d["id"],
            )
        if d["state"] in ("redriven", "discarded"):
            add(d["resolved_at"], 7, d["state"], f"dead letter {d['id']}", ref=d["id"])
    if signal["status"] == "cancelled":
        add(
            signal["cancelled_at"],
            8,
            "cancelled",
            f"reason {signal['cancel_reason']}; no dead letter",
        )
    events.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in events]
