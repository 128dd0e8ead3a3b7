"""The sentence a dead letter makes of a refused delivery (app.domain.refusals)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from app.domain.diagnosis import Diagnosis, recommend
from app.domain.refusals import Refusal, RefusalReason, mib, most_telling, too_large_detail

T0 = datetime(2026, 12, 6, 12, 0, 3, tzinfo=UTC)


def test_sizes_read_as_a_person_reads_them() -> None:
    assert mib(31 * 1024 * 1024) == "31 MiB"
    assert mib(3 * 1024 * 1024 // 2) == "1.5 MiB"
    assert mib(29_000) == "28 KiB"
    assert mib(800) == "800 bytes"
    assert too_large_detail(31 * 1024 * 1024, 25 * 1024 * 1024) == (
        "message too large (31 MiB > 25 MiB)"
    )


def test_the_refusal_to_the_recipient_wins_then_one_before_any_recipient() -> None:
    to_it = Refusal(T0, 552, "message_too_large", "message too large", ("new-user@x.test",))
    other = Refusal(T0 + timedelta(seconds=5), 550, "recipient_domain", "no", ("b@x.test",))
    unnamed = Refusal(T0 + timedelta(seconds=9), 535, "auth_failed", "invalid")
    hello = Refusal(T0 + timedelta(seconds=10), 0, "tls_on_plain_port")
    assert most_telling([other, unnamed, to_it, hello], "New-User@x.test") == to_it
    assert most_telling([other, unnamed, hello], "new-user@x.test") == unnamed
    assert most_telling([other, hello], "new-user@x.test") is None  # a TLS hello: nobody's


def test_a_dead_letter_names_the_refused_delivery_its_time_and_the_fix() -> None:
    refusal = Refusal(
        T0,
        552,
        RefusalReason.MESSAGE_TOO_LARGE.value,
        too_large_detail(31 * 1024 * 1024, 25 * 1024 * 1024),
        ("new-user@x.test",),
    )
    sentence = recommend(
        Diagnosis(
            reason="deadline",
            provider="sink",
            received_after=T0 - timedelta(seconds=5),
            checks_by_outcome={"no_match": 3},
            last_error_code=None,
            near_misses=[],
            refusal=refusal,
            recipient="new-user@x.test",
        )
    )
    assert sentence == (
        "An SMTP client tried to deliver to new-user@x.test at 12:00:03 UTC and was refused:"
        " 552 message too large (31 MiB > 25 MiB): raise SIGNALBOX_SMTP_MAX_BYTES or send a"
        " smaller attachment."
    )


def test_every_reason_has_its_own_fix() -> None:
    from app.domain.refusals import fix_for

    fixes = {fix_for(r.value) for r in RefusalReason}
    assert len(fixes) == len(RefusalReason)
