"""Plain-text tables of the CLI."""

from __future__ import annotations

from signalbox import render
from signalbox.models import Claim, DeadLetter, Evidence, Receipt, Signal
from signalbox_fakes import CLAIM, DEAD_LETTER, RECEIPT, signal_view


def test_table_pads_columns_and_marks_empty_cells() -> None:
    out = render.table(["id", "reason"], [("dlq_1", "deadline"), ("dlq_22", None)])
    assert out.splitlines() == [
        "ID      REASON",
        "dlq_1   deadline",
        "dlq_22  -",
    ]


def test_cells_stay_on_one_line_even_with_newlines_in_a_subject() -> None:
    out = render.table(["subject"], [("line one\nline two",)])
    assert out.splitlines()[1] == "line one line two"


def test_signal_shows_result_checks_and_message() -> None:
    out = render.signal(Signal.from_api(signal_view("found")))
    assert "result" in out and "found" in out
    assert "3/30" in out
    assert "Verify your account" in out
    assert "retry_after_seconds" not in out


def test_waiting_signal_shows_retry_after() -> None:
    assert "retry_after_seconds  2" in render.signal(Signal.from_api(signal_view("waiting")))


def test_claim_output_marks_email_content_as_untrusted() -> None:
    out = render.claim(Claim.from_api(CLAIM, "sig_1"))
    banner_at = out.index(render.UNTRUSTED_BANNER)
    assert out.index("http://app.test/verify?t=abc") > banner_at
    assert out.index("123456") > banner_at
    assert out.index("clm_1") < banner_at


def test_dead_letter_shows_reason_recommendation_and_near_misses() -> None:
    out = render.dead_letter(DeadLetter.from_api(DEAD_LETTER))
    assert "deadline" in out
    assert "3 s before the window" in out
    assert "received_before_window" in out
    assert "7 (no_match=7)" in out


def test_receipt_and_evidence_render_ids() -> None:
    assert "rcp_1" in render.receipt(Receipt.from_api(RECEIPT))
    ev = Evidence.from_api(
        {
            "run_id": "run-1",
            "signals": [
                {"signal_id": "sig_1", "status": "consumed", "test_case": "t1", "receipt": RECEIPT}
            ],
        }
    )
    out = render.evidence(ev)
    assert out.splitlines()[0] == "run run-1"
    assert "rcp_1" in out and "consumed" in out
    assert render.evidence(Evidence.from_api({"run_id": "r", "signals": []})) == "run r: no signals"


def test_timestamps_print_in_utc_with_z() -> None:
    assert "consumed_at     2030-01-01T00:00:09Z" in render.receipt(Receipt.from_api(RECEIPT))
    assert render.fmt(Signal.from_api(signal_view()).created_at) == "2030-01-01T00:00:00Z"
