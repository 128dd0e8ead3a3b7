"""Recipient typos, looked for when a signal expires: a message that passed
every other rule of the signal, received in its window by an address one or
two edits from its recipient (docs/api.md, "Typos"), is a near miss with
`why: recipient_typo`. The expiry's callers hand this look to
`app.usecases.expiry`, which runs it after the signal's expiry and before
its dead letter is written (expiry imports no check).

Only mail the signal's namespace may see is looked at, and only addresses
that belong to the namespace or that nobody holds or owns: mail another
namespace holds or owns is never considered. Checks search for the
recipient exactly, so the sink's store (a provider of type `sink`) and the
messages checks already recorded (a polled provider answers every message
of the mailbox) are searched here, bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sqlalchemy import Connection

from app.db import messages as messages_db
from app.db import sink_messages as sink_messages_db
from app.domain.matching import Candidate, Why, evaluate
from app.domain.typos import address_edits
from app.infra.parse_budget import parse_on_budget
from app.providers.base import WHOLE_SECONDS, ProviderMessage
from app.providers.runtime import provider_configs
from app.settings import Settings
from app.usecases.checks.criteria import criteria_for
from app.usecases.checks.observed import Observed, Parser, record_messages
from app.usecases.visibility import may_watch, visible_ids

# The latest messages of the window looked at, the candidates parsed, and the
# typo near misses recorded per signal.
SCAN = 2000
CANDIDATES = 50
KEPT = 5
# Candidates recorded (and parsed) at a time.
SLICE = 10


def record_typo_near_misses(
    session: Connection,
    settings: Settings,
    signal: Mapping[Any, Any],
    parse: Parser = parse_on_budget,
) -> list[str]:
    """Record the recipient typos of the expired `signal` (a row of `signals`)
    as its near misses; return the ids of the messages recorded."""
    recipient = str(signal["recipient"]).lower()
    provider = str(signal["provider"])
    # Whole seconds: a provider stamping seconds never hides a typo sent in
    # the window's first second.
    since = signal["received_after"] - WHOLE_SECONDS
    until = signal["expires_at"]
    bounds = {"since": since, "until": until, "scan": SCAN, "limit": CANDIDATES}

    found: list[ProviderMessage] = []
    config = provider_configs(settings).get(provider)
    if config is not None and config.type == "sink":
        found += [
            ProviderMessage(
                provider_message_id=str(r["id"]),
                received_at=r["received_at"],
                raw=None,
                envelope_recipients=tuple(r["envelope_recipients"]),
                size=int(r["size"]),
                auth_namespace=r["auth_namespace"],
                message_id=r["message_id"],
            )
            for r in sink_messages_db.sink_message_near_address(session, recipient, **bounds)
        ]
    seen = {m.provider_message_id for m in found}
    # Recorded already (by a polled provider's checks): their bytes are in
    # `messages`, read only for those this process has not parsed.
    recorded = [
        ProviderMessage(
            provider_message_id=r["provider_message_id"],
            received_at=r["received_at"],
            raw=None,
            envelope_recipients=tuple(r["recipients"]),
            recorded_known=True,
            recorded_id=r["id"],
            size=int(r["size"]),
        )
        for r in messages_db.message_near_address(session, provider, recipient, **bounds)
        if r["provider_message_id"] not in seen
    ]
    if not found and not recorded:
        return []
    namespace = str(signal["namespace"])
    usable: dict[str, bool] = {}

    def may_use(address: str) -> bool:
        if address not in usable:
            usable[address] = may_watch(session, settings, namespace, address)
        return usable[address]

    # Candidates come by address from SQL, without their bytes; they are
    # recorded (and parsed, when this process has not) a slice at a time,
    # until KEPT typos are found: a candidate after those is never read.
    read_recorded = partial(messages_db.message_raws, provider=provider)
    slices = [(found[i : i + SLICE], None) for i in range(0, len(found), SLICE)] + [
        (recorded[i : i + SLICE], read_recorded) for i in range(0, len(recorded), SLICE)
    ]
    typos: list[tuple[str, str]] = []
    for messages, read in slices:
        if len(typos) >= KEPT:
            break
        observed = (
            record_messages(session, provider, messages, parse=parse)
            if read is None
            else record_messages(session, provider, messages, read, parse)
        )
        typos += _typos_among(session, settings, signal, observed, may_use)[: KEPT - len(typos)]
    if typos:
        messages_db.near_miss_record_many(
            session,
            signal["id"],
            [(mid, Why.RECIPIENT_TYPO.value, ()) for mid, _ in typos],
            addresses=[address for _, address in typos],
        )
    return [mid for mid, _ in typos]


def _typos_among(
    session: Connection,
    settings: Settings,
    signal: Mapping[Any, Any],
    observed: list[Observed],
    may_use: Callable[[str], bool],
) -> list[tuple[str, str]]:
    """(message id, near address) of each observed message that passes every
    other rule of `signal` at an address one or two edits from its recipient."""
    recipient = str(signal["recipient"]).lower()
    namespace = str(signal["namespace"])
    # Mail the namespace may see, or that nobody owned or held: never mail
    # another namespace owns or holds.
    visible = visible_ids(
        session, settings, namespace, [o.message_id for o in observed], unclaimed=True
    )
    taken = messages_db.message_taken(session, [o.message_id for o in observed], namespace)
    typos: list[tuple[str, str]] = []
    for o in observed:
        if o.message_id not in visible or o.message.received_at > signal["expires_at"]:
            continue
        addresses = sorted(
            {a.lower() for a in (*o.message.envelope_recipients, *o.mail.to, *o.mail.cc)}
        )
        near = [a for a in addresses if address_edits(recipient, a) is not None and may_use(a)]
        for address in near:
            criteria = criteria_for({**signal, "recipient": address}, WHOLE_SECONDS)
            candidate = Candidate(
                message_id=o.message_id,
                received_at=o.message.received_at,
                mail=o.mail,
                envelope_recipients=tuple(addresses),
                taken_by_other=taken.get(o.message_id, signal["id"]) != signal["id"],
            )
            if evaluate(criteria, candidate).matched:
                typos.append((o.message_id, address))
                break
    return typos
