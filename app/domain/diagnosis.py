"""Turn what is known about a dead signal into one sentence an SRE can act on.

Pure: the caller gathers the expiry reason, the check counts and the near misses
(docs/api.md, "Dead letters") and stores the sentence as the ``recommendation``.
The sentence is shown in the API, the CLI and CI evidence, so it never quotes a
body, a link or a one-time code: subjects are quoted only after those are
masked. Only a ``recipient_typo`` names addresses (the recipient and the one
the message went to); the run's evidence replaces them with their hashes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.domain.masking import mask_subject
from app.domain.matching import Why
from app.domain.moments import as_utc, rounded_span
from app.domain.refusals import Refusal, refusal_sentence

__all__ = ["Diagnosis", "NearMiss", "recommend"]


@dataclass(frozen=True)
class NearMiss:
    """A message to the recipient that failed a rule.

    ``why`` is a :class:`~app.domain.matching.Why` value, the first rule it
    failed; ``also`` the other rules it failed. ``run_marker`` is the marker
    the message carried, when known: it lets a ``run_marker_mismatch``
    recommendation name the other run. ``recipient`` and ``address`` are set
    for a ``recipient_typo``: the signal's recipient and the address the
    message went to instead.
    """

    message_id: str
    received_at: datetime
    subject: str
    why: str
    run_marker: str | None = None
    also: tuple[str, ...] = ()
    recipient: str | None = None
    address: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """Everything the recommendation is based on.

    ``reason`` is the expiry reason (``deadline``, ``check_budget``,
    ``provider_errors``, ``claims_exhausted``). ``checks_by_outcome`` counts the
    checks per outcome (``no_match``, ``matched``, ``provider_error``,
    ``circuit_open``); missing outcomes count 0. ``subject_contains`` is the
    signal's subject filter, when it had one, so a ``subject_mismatch`` can be
    shown against it.
    """

    reason: str
    provider: str
    received_after: datetime
    checks_by_outcome: Mapping[str, int]
    last_error_code: str | None
    near_misses: Sequence[NearMiss]
    subject_contains: str | None = None
    # A matching message that arrived after the signal expired: seconds
    # after its deadline (negative when it expired earlier, on its budget).
    late_seconds_after_deadline: float | None = None
    # A delivery to `recipient` that the sink refused within the window.
    refusal: Refusal | None = None
    recipient: str = ""


def recommend(d: Diagnosis) -> str:
    """One actionable sentence naming the most likely cause of the dead letter.

    Causes are considered in this order, the first that applies wins:

    1. ``claims_exhausted``: the consumer never consumed within its leases;
    2. ``provider_errors``, or most checks failed at the provider / were skipped
       by an open circuit: the provider was not really looked at, so nothing
       else can be concluded;
    3. a delivery to the recipient that the sink refused in the window
       (550, 552, a chaos rule, AUTH, STARTTLS: `app.domain.refusals`);
    4. a near miss, the most telling first (fewest failed rules, then in
       :class:`Why` order; the latest received within one kind);
    5. no check ran at all: the workers are not consuming;
    6. no message to the recipient reached the provider.
    """
    counts = {k: max(int(v), 0) for k, v in d.checks_by_outcome.items()}
    total = sum(counts.values())
    provider = _identifier(d.provider) or "unknown"
    errors = counts.get("provider_error", 0)
    circuit = counts.get("circuit_open", 0)

    if d.late_seconds_after_deadline is not None and d.reason != "claims_exhausted":
        return _late_sentence(d.late_seconds_after_deadline, d.reason)
    if d.reason == "claims_exhausted":
        return (
            "The consumer claimed the message but never consumed it within the lease, "
            "on every allowed claim: consume the claim before its lease ends, or ask for "
            "a longer lease_seconds or extend the lease while working."
        )
    if circuit and circuit * 2 > total and circuit >= errors:
        return (
            f"The circuit breaker for provider '{provider}' was open for {circuit} of "
            f"{total} checks, so the provider was not asked{_last_error(d)}: restore the "
            "provider's health, then redrive the signal."
        )
    if d.reason == "provider_errors" or (errors and errors * 2 > total):
        return (
            f"Provider '{provider}' failed {errors} of {total} checks{_last_error(d)}: "
            "check the provider's availability, address and credentials, then redrive "
            "the signal."
        )

    if d.refusal is not None:
        return refusal_sentence(d.refusal, d.recipient)

    near = _most_telling(d.near_misses)
    if near is not None:
        return _near_miss_sentence(near, d)

    if total == 0:
        return (
            f"No check of provider '{provider}' ran before the signal expired: check that "
            "the Celery workers are running and consuming the 'signals' queue."
        )
    if d.reason == "check_budget":
        limit = f"within the check budget ({total} checks)"
        fix = "raise max_checks if the email is slow to arrive"
    elif d.reason == "deadline":
        limit = f"before the deadline ({total} checks)"
        fix = "raise expires_in_seconds if the email is slow to arrive"
    else:
        limit = f"before the signal expired ({_identifier(d.reason) or 'unknown reason'})"
        fix = "see the checks of this dead letter"
    return (
        f"No message to this recipient reached provider '{provider}' {limit}: check that "
        "the application sent it to the right address and SMTP host (or provider), "
        f"or {fix}."
    )


def _late_sentence(seconds: float, reason: str) -> str:
    if seconds >= 0:
        when = f"{_format_gap(timedelta(seconds=seconds))} after the deadline"
        if seconds < 1:
            when = "just after the deadline"
        return (
            f"The matching message arrived {when}: raise expires_in_seconds "
            "(or make the application send it sooner)."
        )
    early = _format_gap(timedelta(seconds=-seconds))
    fix = "raise max_checks" if reason == "check_budget" else "restore the provider's health"
    return (
        f"The matching message arrived after the signal expired ({reason}), {early} before "
        f"its deadline: {fix}, or redrive the signal."
    )


# --------------------------------------------------------------------------- near misses

_WHY_RANK = {why.value: rank for rank, why in enumerate(Why)}


def _most_telling(near_misses: Sequence[NearMiss]) -> NearMiss | None:
    known = [n for n in near_misses if n.why in _WHY_RANK]
    if not known:
        return None
    # A message that failed one rule tells more than one that failed several;
    # then the lowest Why rank; within one kind the latest message, which is
    # the closest to the window and the likeliest to be the one the test meant.
    return min(
        known,
        key=lambda n: (
            len([a for a in n.also if a in _WHY_RANK]),
            _WHY_RANK[n.why],
            -as_utc(n.received_at).timestamp(),
        ),
    )


def _near_miss_sentence(near: NearMiss, d: Diagnosis) -> str:
    cause, fix = _near_miss_parts(near, d)
    also = [a for a in near.also if a in _WHY_RANK]
    if also:
        cause += f" (it also failed {', '.join(also)})"
    return f"{cause}: {fix}"


def _near_miss_parts(near: NearMiss, d: Diagnosis) -> tuple[str, str]:
    """(what happened, what to do) for the near miss."""
    why = Why(near.why)
    if why is Why.RECEIVED_BEFORE_WINDOW:
        gap = _format_gap(as_utc(d.received_after) - as_utc(near.received_at))
        return (
            f"A message to this recipient arrived {gap} before the window opened",
            "send the email after creating the signal, or set received_after earlier.",
        )
    if why is Why.RUN_MARKER_MISMATCH:
        marker = _identifier(near.run_marker or "")
        carried = f"run marker '{marker}'" if marker else "another run's marker"
        return (
            f"A message to this recipient carried {carried}, not this signal's run_id",
            "give each run its own recipient (POST /v1/mailboxes), or send the email with "
            "this run's X-Signalbox-Run header.",
        )
    if why is Why.RUN_MARKER_MISSING:
        return (
            "A message to this recipient arrived without a run marker while the signal "
            "requires one",
            "send the email with the X-Signalbox-Run header set to the "
            "run_id, or create the signal without require_run_marker.",
        )
    if why is Why.SUBJECT_MISMATCH:
        wanted = (
            f"'{_quote_subject(d.subject_contains)}'"
            if d.subject_contains
            else "the subject_contains filter"
        )
        return (
            f"A message to this recipient arrived with subject '{_quote_subject(near.subject)}', "
            f"which does not contain {wanted}",
            "fix subject_contains or the subject the application sends.",
        )
    if why is Why.BODY_MISMATCH:
        return (
            "A message to this recipient matched every rule but body_contains",
            "check the filter against the email's text part (or its HTML with the tags stripped).",
        )
    if why is Why.RECIPIENT_TYPO:
        sent = _address(near.address or "") or "another address"
        meant = _address(near.recipient or "") or "the recipient"
        return (
            f"A message that passed every other rule went to '{sent}', a typo away from "
            f"the recipient '{meant}'",
            "fix the address the application (or its fixture) sends to, or the signal's recipient.",
        )
    return (
        "A message to this recipient was already the message of another signal",
        "give each signal its own recipient, or a subject_contains filter that tells the "
        "emails apart.",
    )


# --------------------------------------------------------------------------- formatting

# Anything that could be a link, an address or a one-time code is masked before a
# subject is quoted: the recommendation travels to places a code must never reach.
_SUBJECT_MAX = 80
_CUT_WORD = re.compile(r"\S+\Z")


def _quote_subject(subject: str) -> str:
    # Only the first _SUBJECT_MAX characters are shown; cutting first also keeps the
    # masking linear and short on a hostile megabyte-long subject. A word cut in two
    # at the edge is dropped: the first letters of a capitals code are no code, nor
    # is a link cut before its query.
    head = subject[: _SUBJECT_MAX * 4]
    if len(subject) > len(head):
        head = _CUT_WORD.sub("", head)
    text = mask_subject(head)
    # The subject is shown inside single quotes; keep the quoting unambiguous.
    text = " ".join(text.replace("'", "\u2019").split())
    if len(text) > _SUBJECT_MAX:
        text = text[: _SUBJECT_MAX - 1].rstrip() + "\u2026"
    return text


def _address(value: str, limit: int = 254) -> str:
    """Keep only the characters of a plain address: a typo's address comes
    from a message, and a hostile one must not write the sentence."""
    return re.sub(r"[^A-Za-z0-9.!#$%&*+/=?^_`{|}~@-]", "", value)[:limit]


def _identifier(value: str, limit: int = 64) -> str:
    """Keep only the characters of an identifier (run ids, provider names, error codes)."""
    return re.sub(r"[^A-Za-z0-9._:-]", "", value)[:limit]


def _last_error(d: Diagnosis) -> str:
    code = _identifier(d.last_error_code or "")
    return f", last with error code '{code}'" if code else ""


def _format_gap(gap: timedelta) -> str:
    seconds = gap.total_seconds()
    if seconds < 1:
        return "less than 1 s"
    return rounded_span(seconds)
