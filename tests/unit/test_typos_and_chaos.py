"""Pure decisions of wave 3's diagnosis and chaos: edit distances and typos,
near misses with several failed rules in the recommendation, the SMTP
replies a chaos rule may send, and which rule covers an address."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.chaos import ChaosRule, ChaosStage, is_valid_reply, pattern_matches, rules_for
from app.domain.diagnosis import Diagnosis, NearMiss, recommend
from app.domain.masking import mask_addresses
from app.domain.typos import WELL_KNOWN_DOMAINS, address_edits, domain_suggestion, edit_distance

WINDOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


# --------------------------------------------------------------------------- edits


@pytest.mark.parametrize(
    ("a", "b", "edits"),
    [
        ("gmail", "gmail", 0),
        ("gamil", "gmail", 1),  # a swapped pair is one edit
        ("gmal", "gmail", 1),
        ("gmaill", "gmail", 1),
        ("gnail", "gmail", 1),
        ("gmial", "gmail", 1),
        ("hotmial", "hotmail", 1),
        ("yaho", "yahoo", 1),
        ("gmai1l", "gmail", 1),
        ("gxaxl", "gmail", 2),
        ("outlk", "outlook", 2),
        ("abc", "xyz", 3),  # past the limit: limit + 1
    ],
)
def test_edit_distance_counts_a_swap_as_one_edit(a: str, b: str, edits: int) -> None:
    assert edit_distance(a, b) == edits


@given(st.text(max_size=12), st.text(max_size=12))
def test_edit_distance_is_symmetric_and_bounded(a: str, b: str) -> None:
    d = edit_distance(a, b)
    assert d == edit_distance(b, a)
    assert 0 <= d <= 3
    assert (d == 0) == (a == b)


def test_a_huge_hostile_string_is_cut_short() -> None:
    assert edit_distance("x" * 5000, "y" * 5000) == 3


def test_address_edits_are_in_the_local_part_or_in_the_domain_never_both() -> None:
    assert address_edits("new-user@example.test", "new-usre@example.test") == 1
    assert address_edits("new-user@example.test", "New-User@Example.TEST") is None  # same
    assert address_edits("new-user@example.test", "new-user@exmaple.test") == 1
    assert address_edits("new-user@example.test", "new-usre@exmaple.test") is None
    assert address_edits("new-user@example.test", "someone@example.test") is None
    assert address_edits("ab@x.test", "ab+1@x.test") == 2
    assert address_edits("not-an-address", "not-an-address2") is None


def test_domain_typos_suggest_the_domain_meant_and_exact_domains_get_none() -> None:
    known = ("signalbox.test", *WELL_KNOWN_DOMAINS)
    assert domain_suggestion("qa@gamil.com", known) == "gmail.com"
    assert domain_suggestion("qa@signalbox.tset", known) == "signalbox.test"
    assert domain_suggestion("qa@outlok.com", known) == "outlook.com"
    for exact in ("gmail.com", "mail.com", "gmx.de", "signalbox.test"):
        assert domain_suggestion(f"qa@{exact}", known) is None
    for unrelated in ("example.test", "example.com", "acme.io", "corp.internal"):
        assert domain_suggestion(f"qa@{unrelated}", known) is None


# --------------------------------------------------------------------------- recommendation


def _diagnosis(*near: NearMiss, subject_contains: str | None = "Verify") -> Diagnosis:
    return Diagnosis(
        reason="deadline",
        provider="sink",
        received_after=WINDOW,
        checks_by_outcome={"no_match": 3},
        last_error_code=None,
        near_misses=near,
        subject_contains=subject_contains,
    )


def test_a_near_miss_that_failed_several_rules_is_named_with_the_others() -> None:
    miss = NearMiss(
        "msg_1",
        WINDOW + timedelta(seconds=2),
        "Welcome aboard",
        "run_marker_mismatch",
        run_marker="run-other",
        also=("subject_mismatch",),
    )
    sentence = recommend(_diagnosis(miss))
    assert "run marker 'run-other'" in sentence
    assert "(it also failed subject_mismatch)" in sentence
    assert not sentence.startswith("No message to this recipient")
    assert sentence.endswith(".")


def test_a_near_miss_failing_one_rule_tells_more_than_one_failing_several() -> None:
    several = NearMiss(
        "msg_1",
        WINDOW + timedelta(seconds=2),
        "Hi",
        "run_marker_mismatch",
        run_marker="run-x",
        also=("subject_mismatch", "body_mismatch"),
    )
    one = NearMiss("msg_2", WINDOW + timedelta(seconds=3), "Welcome", "subject_mismatch")
    assert "with subject 'Welcome'" in recommend(_diagnosis(several, one))


def test_a_recipient_typo_names_both_addresses() -> None:
    typo = NearMiss(
        "msg_1",
        WINDOW + timedelta(seconds=2),
        "Verify",
        "recipient_typo",
        recipient="new-user@example.test",
        address="new-usre@example.test",
    )
    sentence = recommend(_diagnosis(typo))
    assert "'new-usre@example.test'" in sentence
    assert "'new-user@example.test'" in sentence
    assert mask_addresses(sentence).count("<address>") == 2


def test_a_hostile_typo_address_cannot_write_the_sentence() -> None:
    typo = NearMiss(
        "msg_1",
        WINDOW,
        "Verify",
        "recipient_typo",
        recipient="a@example.test",
        address="b@example.test' https://evil.example/x?t=1 '",
    )
    sentence = recommend(_diagnosis(typo))
    assert "https://" not in sentence and " '" not in sentence.split("went to ")[1][:40]


# --------------------------------------------------------------------------- chaos


@pytest.mark.parametrize(
    "reply",
    [
        "451 4.3.0 Try again later",
        "450 Mailbox busy",
        "550 5.1.1 No such user",
        "421 4.7.0 Too busy",
        "554",
        "452 4.2.2 Over quota",
    ],
)
def test_valid_smtp_replies_are_accepted(reply: str) -> None:
    assert is_valid_reply(reply)


@pytest.mark.parametrize(
    "reply",
    [
        "250 OK",  # not a failure
        "354 go ahead",
        "600 nope",
        "46 4.3.0 short",
        "4510 long",
        "451 5.3.0 class differs from the code",
        "451 4.3.0 Try again\r\n250 OK",  # a second reply smuggled in
        "451 4.3.0 bell \x07",
        "451 text caf\u00e9",  # not ASCII
        "451-multi line",
        "",
        "451 " + "x" * 600,
    ],
)
def test_invalid_smtp_replies_are_refused(reply: str) -> None:
    assert not is_valid_reply(reply)


def _rule(recipient: str, stage: ChaosStage = ChaosStage.RCPT, **kw: object) -> ChaosRule:
    return ChaosRule(
        rule_id=f"chs_{recipient}",
        recipient=recipient,
        stage=stage,
        reply="451 4.3.0 Try again later",
        expires_at=kw.pop("expires_at", WINDOW + timedelta(hours=1)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_rules_cover_their_address_or_domain_at_their_stage_while_live() -> None:
    exact, domain = _rule("a@x.test"), _rule("*@y.test")
    data = _rule("a@x.test", ChaosStage.DATA)
    ended = _rule("a@x.test", expires_at=WINDOW)
    used_up = _rule("a@x.test", exhausted=True)
    rules = [exact, domain, data, ended, used_up]
    assert rules_for(rules, ChaosStage.RCPT, ["A@X.test"], WINDOW) == [exact]
    assert rules_for(rules, ChaosStage.RCPT, ["<b@y.test>"], WINDOW) == [domain]
    assert rules_for(rules, ChaosStage.RCPT, ["b@sub.y.test"], WINDOW) == []
    assert rules_for(rules, ChaosStage.DATA, ["z@z.test", "a@x.test"], WINDOW) == [data]
    assert not pattern_matches("*@y.test", "y.test@other.test")


# --------------------------------------------------------------------------- the sink's copy


class _Calls:
    def __init__(self, rows: list[dict[str, object]]) -> None:
        self.rows, self.live, self.applied = rows, 0, 0


@pytest.fixture
def sink_chaos(monkeypatch: pytest.MonkeyPatch) -> tuple[object, _Calls, list[bytes]]:
    """A SinkChaos whose database and Redis are counted stand-ins."""
    import contextlib

    from app.settings import load_settings
    from app.usecases import chaos

    calls = _Calls([])
    version = [b"1"]

    @contextlib.contextmanager
    def session() -> object:
        yield None

    def live(_: object) -> list[dict[str, object]]:
        calls.live += 1
        return calls.rows

    def apply(_: object, rule_id: str) -> str | None:
        calls.applied += 1
        return "451 4.3.0 Try again later"

    monkeypatch.setattr(chaos, "autocommit", session)
    monkeypatch.setattr(chaos, "transaction", session)
    monkeypatch.setattr(chaos.chaos_db, "chaos_rule_live", live)
    monkeypatch.setattr(chaos.chaos_db, "chaos_rule_apply", apply)
    monkeypatch.setattr(chaos.SinkChaos, "_read_version", lambda self: version[0])
    now = [0.0]
    gate = chaos.SinkChaos(load_settings(), clock=lambda: now[0])
    gate.now = now  # type: ignore[attr-defined]
    return gate, calls, version


def test_with_no_rules_the_sink_asks_the_database_nothing_per_command(
    sink_chaos: tuple[object, _Calls, list[bytes]],
) -> None:
    gate, calls, version = sink_chaos
    gate.refresh()  # type: ignore[attr-defined]
    assert calls.live == 1
    for _ in range(100):
        gate.refresh()  # type: ignore[attr-defined]
        assert gate.reply_for(ChaosStage.RCPT, ["a@x.test"]) is None  # type: ignore[attr-defined]
    assert (calls.live, calls.applied) == (1, 0)
    # A change (the version in Redis) is read at the next mail transaction.
    calls.rows = [
        {
            "id": "chs_1",
            "namespace": "default",
            "recipient": "a@x.test",
            "stage": "rcpt",
            "reply": "451 4.3.0 Try again later",
            "expires_at": datetime.now(UTC) + timedelta(hours=1),
            "times": 1,
            "probability": None,
            "exhausted": False,
        }
    ]
    version[0] = b"2"
    gate.refresh()  # type: ignore[attr-defined]
    assert calls.live == 2
    assert gate.reply_for(ChaosStage.RCPT, ["b@x.test"]) is None  # type: ignore[attr-defined]
    assert calls.applied == 0  # another address: no round trip
    assert gate.reply_for(ChaosStage.RCPT, ["A@x.test"]) == "451 4.3.0 Try again later"  # type: ignore[attr-defined]
    assert calls.applied == 1
