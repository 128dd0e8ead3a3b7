"""The CPU of one look over many signals on one address with large mails:
what `body_contains` costs the sink and beat (issue: CPU amplification).

    uv run python bench/match_cost.py [--signals 200] [--mails 3] [--mb 10]

It parses `--mails` messages of `--mb` MB of text each (as the sink's parse
pool would, once per process), then matches `--signals` signals, each with
its own `body_contains` that none of the mails holds (the worst case: every
signal searches every mail to its end), the way a check's transaction 2
does (`app.domain.matching.pick`, once per signal over every candidate). It
prints the CPU of that look, and the same look with the text normalised per
signal and candidate (what the matcher did before the searched text was
made once per message), for comparison; and the cap's effect
(SIGNALBOX_MATCH_TEXT_MAX_BYTES, 1 MiB by default).

A benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import sys
import time
import unicodedata
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.domain.mail import ParsedMail, normalize_whitespace, parse_mail
from app.domain.matching import Candidate, Criteria, pick
from bench._machine import describe, render

RECIPIENT = "shared-inbox@example.test"
T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def big_mail(i: int, megabytes: float) -> bytes:
    line = f"mail {i}: a line of ordinary text with words\r\n"
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = RECIPIENT
    msg["Subject"] = f"Report {i}"
    msg.set_content(line * int(megabytes * 1_000_000 / len(line)))
    return bytes(msg)


def cpu() -> float:
    return time.process_time()


def look(mails: list[ParsedMail], signals: int, cap: int) -> float:
    """CPU seconds of one look: every signal over every mail."""
    candidates = [
        Candidate(message_id=f"msg_{i}", received_at=T0, mail=m) for i, m in enumerate(mails)
    ]
    began = cpu()
    for s in range(signals):
        criteria = Criteria(
            recipient=RECIPIENT,
            run_id="bench",
            received_after=T0 - timedelta(seconds=1),
            body_contains=f"needle {s:05d} nowhere",
            text_max_bytes=cap,
        )
        pick(criteria, candidates)
    return cpu() - began


def look_per_signal(mails: list[ParsedMail], signals: int) -> float:
    """The same look with the text normalised per signal and candidate."""
    began = cpu()
    for s in range(signals):
        needle = normalize_whitespace(unicodedata.normalize("NFC", f"needle {s:05d} nowhere"))
        for m in mails:
            _ = needle in normalize_whitespace(unicodedata.normalize("NFC", m.matchable_text()))
    return cpu() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument("--mails", type=int, default=3)
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument(
        "--before-signals",
        type=int,
        default=10,
        help="signals for the per-signal comparison (it is slow; scaled to --signals)",
    )
    args = parser.parse_args()
    print("machine")
    print(render(describe()))
    raws = [big_mail(i, args.mb) for i in range(args.mails)]
    began = cpu()
    mails = [parse_mail(r) for r in raws]
    parse = cpu() - began
    capped = look(mails, args.signals, 1024 * 1024)
    # A fresh parse: the first look above made each mail's searched text.
    again = look(mails, args.signals, 1024 * 1024)
    uncapped = look([parse_mail(r) for r in raws], args.signals, 64 * 1024 * 1024)
    before = look_per_signal(mails, args.before_signals) * args.signals / args.before_signals
    print(
        f"\none look: {args.signals} signals with body_contains on one address,"
        f" {args.mails} mails of {args.mb:g} MB"
    )
    print(f"  parse (sink's parse pool, once per message)     {parse * 1000:9.0f} ms CPU")
    print(f"  look, text capped at 1 MiB (first look)         {capped * 1000:9.0f} ms CPU")
    print(f"  look, text capped at 1 MiB (next looks)         {again * 1000:9.0f} ms CPU")
    print(f"  look, uncapped (64 MiB), first look             {uncapped * 1000:9.0f} ms CPU")
    print(
        f"  look, normalised per signal and candidate       {before * 1000:9.0f} ms CPU"
        f" (measured over {args.before_signals} signals, scaled)"
    )
    per_signal = capped / args.signals * 1000
    print(f"  CPU per signal per look (capped)               {per_signal:9.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
