"""The soak's invariants, checked on the database against what the harness did.

`check(conn, record, alerts)` reads the Signalbox tables through `conn` (a
psycopg connection), compares them with the soak's `record` (the signals it
created and every mail it delivered, with the instants the provider
acknowledged them) and with `alerts` (how many times the `dead_letter` queue's
consumer handled each dead letter), and returns a `Report` whose `render()` is
a table, one row per invariant with its count of violations. Every count must
be 0.

A record is plain JSON (the harness writes it next to its logs), so the check
can be run again later on a kept database:

    python bench/soak_invariants.py --record RUN/soak-record.json --database-url URL
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FOUND = ("found", "claimed", "consumed")
# Checks the schedule asked for: the only ones that spend max_checks.
COUNTED_REASONS = ("first", "scheduled", "error_retry", "sweep")
MAIL_ID = re.compile(r"#(m\d+)")
# A provider that stamps whole seconds may put a mail up to 1 s earlier than it came.
CLOCK_SLACK = 1.0


@dataclass
class Row:
    name: str
    violations: int
    examples: list[str] = field(default_factory=list)


@dataclass
class Report:
    rows: list[Row]
    info: list[tuple[str, str]]

    @property
    def violations(self) -> int:
        return sum(r.violations for r in self.rows)

    def render(self, examples: int = 8) -> str:
        width = max(len(r.name) for r in self.rows)
        lines = [f"  {'invariant':<{width}}  violations", f"  {'-' * width}  ----------"]
        for row in self.rows:
            lines.append(f"  {row.name:<{width}}  {row.violations:>10}")
        details = [r for r in self.rows if r.violations and r.examples]
        if details:
            lines.append("")
            lines.append("  examples")
            for row in details:
                lines.append(f"  - {row.name}:")
                lines.extend(f"      {e}" for e in row.examples[:examples])
        if self.info:
            lines.append("")
            label = max(len(k) for k, _ in self.info)
            lines.extend(f"  {k:<{label}}  {v}" for k, v in self.info)
        return "\n".join(lines)


def _overlaps(
    outages: Sequence[Mapping[str, Any]], provider: str, start: float, end: float
) -> bool:
    return any(
        o["provider"] == provider and o["started"] <= end and (o["ended"] or end) >= start
        for o in outages
    )


def check(conn: Any, record: Mapping[str, Any], alerts: Mapping[str, int]) -> Report:  # noqa: C901 - the invariants in one list
    """Every invariant of the soak, on the database `conn` is connected to."""
    grace = float(record["grace"])
    offset = float(record["clock_offset"])  # server clock - harness clock
    breaker_hold = float(record.get("breaker_open", 0.0)) + 1.0
    signals = [s for s in record["signals"] if s.get("signal_id")]
    by_id = {s["signal_id"]: s for s in signals}
    mails = {m["mail_id"]: m for m in record["mails"]}
    mails_of: dict[str, list[Mapping[str, Any]]] = {}
    for m in record["mails"]:
        if m.get("signal_key"):
            mails_of.setdefault(m["signal_key"], []).append(m)
    # Providers count as down a little longer than they were: the breaker
    # legitimately holds calls off for its open period after an outage.
    outages = [
        {**o, "ended": (o["ended"] + breaker_hold) if o.get("ended") else None}
        for o in record.get("outages", [])
    ]

    rows_db = conn.execute(
        "SELECT s.id, s.status, s.expiry_reason, s.message_id, s.namespace, s.checks_count,"
        " s.generation, extract(epoch FROM s.expires_at), extract(epoch FROM s.expired_at),"
        " m.subject, extract(epoch FROM m.received_at)"
        " FROM signals s LEFT JOIN messages m ON m.id = s.message_id"
    ).fetchall()
    db = {
        r[0]: {
            "status": r[1],
            "reason": r[2],
            "message_id": r[3],
            "namespace": r[4],
            "checks_count": r[5],
            "generation": r[6],
            "expires_at": float(r[7]),
            "expired_at": float(r[8]) if r[8] is not None else None,
            "subject": r[9],
            "received_at": float(r[10]) if r[10] is not None else None,
        }
        for r in rows_db
    }

    # When each signal's provider last answered a look, by the start of that look.
    answered_looks: dict[str, list[float]] = {}
    for signal_id, started in conn.execute(
        "SELECT signal_id, extract(epoch FROM started_at) FROM checks"
        " WHERE outcome IN ('no_match', 'matched')"
    ).fetchall():
        answered_looks.setdefault(signal_id, []).append(float(started))

    # 1. Nothing held before the deadline is lost.
    lost: list[str] = []
    lost_by: Counter[str] = Counter()
    excused = expected = 0
    last_second = last_second_found = 0
    for s in signals:
        row = db.get(s["signal_id"])
        if row is None:
            continue
        deadline = row["expires_at"] - offset
        # The window opens at the server's received_after (our clock), which
        # the soak sets ahead of the request for some signals.
        created = max(float(s["created_wall"]), float(s.get("opened_wall") or 0.0))
        delivered = [
            m
            for m in mails_of.get(s["key"], [])
            if m["kind"] == "match" and m.get("acked") is not None
        ]
        in_time = [m for m in delivered if created <= m["acked"] <= deadline - 1.0]
        last = [m for m in delivered if deadline - 1.0 < m["acked"] < deadline]
        if last and not in_time:
            last_second += 1
            last_second_found += row["status"] in FOUND
        if not in_time:
            continue
        expected += 1
        if row["status"] in FOUND:
            continue
        first = min(m["acked"] for m in in_time)
        # The provider never answered a look that began after the mail: it was
        # down, or went down while the (slowed) final look was in flight.
        unanswered = not any(t - offset >= first for t in answered_looks.get(s["signal_id"], ()))
        if (
            _overlaps(outages, s["provider"], first, deadline)
            or (
                row["reason"] == "provider_errors"
                and _overlaps(
                    outages, s["provider"], created, (row["expired_at"] or deadline) - offset
                )
            )
            or (
                unanswered
                and _overlaps(
                    outages, s["provider"], first, (row["expired_at"] or deadline) - offset
                )
            )
        ):
            excused += 1
            continue
        lost_by[f"{s['provider']}/{s['fate']}"] += 1
        lost.append(
            f"{s['signal_id']} ({s['provider']}, {s['group']}, fate {s['fate']}):"
            f" mail acked {deadline - first:.1f} s before the deadline,"
            f" status {row['status']}/{row['reason']}, {row['checks_count']}/{s['max_checks']}"
            " checks"
        )

    # 2. A message satisfies at most one signal per namespace; only a right one.
    dupes = conn.execute(
        "SELECT namespace, message_id, count(*) FROM signals WHERE message_id IS NOT NULL"
        " GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()
    wrong: list[str] = []
    for signal_id, row in db.items():
        s = by_id.get(signal_id)
        if s is None or row["status"] not in FOUND:
            continue
        found = MAIL_ID.search(row["subject"] or "")
        mail = mails.get(found.group(1)) if found else None
        why = _not_for(s, mail, row, offset)
        if why:
            wrong.append(f"{signal_id} ({s['provider']}, run {s['run_id']}): {why}")

    # 3. Checks: one row per (signal, fence); counted ones add up.
    fence_dupes = conn.execute(
        "SELECT signal_id, fence, count(*) FROM checks GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()
    # Each check row says whether it spent the budget (`counted`, written in
    # the statement that adds it to `checks_count`): they add up, and no
    # push, redrive, open breaker or rate limit spent any. (A look that rode
    # along with another signal's check when one check was left spends none
    # either: only the row's own flag knows that.)
    never_spends = (
        "NOT c.reason = ANY(%(reasons)s) OR c.outcome = 'circuit_open'"
        " OR c.error_code IS NOT DISTINCT FROM 'rate_limited'"
    )
    reconcile = conn.execute(
        "SELECT id, checks_count, counted, wrongly FROM ("
        " SELECT s.id, s.checks_count,"
        " count(c.id) FILTER (WHERE c.counted) AS counted,"
        f" count(c.id) FILTER (WHERE c.counted AND ({never_spends})) AS wrongly"
        " FROM signals s LEFT JOIN checks c ON c.signal_id = s.id GROUP BY s.id) t"
        " WHERE checks_count <> counted OR wrongly > 0",
        {"reasons": list(COUNTED_REASONS)},
    ).fetchall()

    # 4. Dead letters: one per expiry, each handled once by the queue's consumer.
    dl_rows = conn.execute(
        "SELECT d.id, d.signal_id, d.generation, s.status, s.generation, d.published_at IS NULL"
        " FROM dead_letters d LEFT JOIN signals s ON s.id = d.signal_id"
    ).fetchall()
    per_generation = Counter((r[1], r[2]) for r in dl_rows)
    dl_wrong: list[str] = []
    for signal_id, row in db.items():
        n = per_generation.get((signal_id, row["generation"]), 0)
        if row["status"] == "expired" and n != 1:
            dl_wrong.append(f"{signal_id}: expired ({row['reason']}) with {n} dead letters")
        elif row["status"] != "expired" and n:
            dl_wrong.append(f"{signal_id}: {row['status']} but has {n} dead letters")
    never = [r[0] for r in dl_rows if alerts.get(r[0], 0) == 0]
    twice = [r[0] for r in dl_rows if alerts.get(r[0], 0) > 1]
    unpublished = sum(1 for r in dl_rows if r[5])

    # 5. Nothing left waiting long after its deadline.
    stuck = conn.execute(
        "SELECT id, extract(epoch FROM now() - expires_at) FROM signals"
        " WHERE status = 'waiting' AND expires_at < now() - make_interval(secs => %s)",
        (grace,),
    ).fetchall()

    # 6. A message is consumed at most once per namespace, and a signal at most
    # once (the soak's consumers race for claims; one mail to a shared address
    # may be each namespace's).
    consumed_twice = conn.execute(
        "SELECT namespace || ' ' || message_id, count(*) FROM receipts GROUP BY 1"
        " HAVING count(*) > 1 UNION ALL"
        " SELECT 'signal ' || signal_id, count(*) FROM receipts GROUP BY 1 HAVING count(*) > 1"
    ).fetchall()

    not_created = [s["key"] for s in record["signals"] if not s.get("signal_id")]
    rows = [
        Row(
            "lost: matching mail held >= 1 s before the deadline, signal not found",
            len(lost),
            lost,
        ),
        Row(
            "a message satisfies two signals of one namespace",
            len(dupes),
            [f"{m} taken {n} times in {ns}" for ns, m, n in dupes],
        ),
        Row("a signal found with a message that does not match it", len(wrong), wrong),
        Row(
            "two check rows for one (signal, fence)",
            len(fence_dupes),
            [f"{sid} fence {f}: {n} rows" for sid, f, n in fence_dupes],
        ),
        Row(
            "checks_count differs from its counted check rows",
            len(reconcile),
            [
                f"{sid}: checks_count {cc}, rows that spent the budget {rows_}, of which"
                f" {wrongly} never should (a push, a redrive, an open breaker, a rate limit)"
                for sid, cc, rows_, wrongly in reconcile
            ],
        ),
        Row(
            "expired signal without exactly one dead letter per generation", len(dl_wrong), dl_wrong
        ),
        Row(
            "dead letter not handled exactly once by the dead_letter queue consumer",
            len(never) + len(twice),
            [f"{d}: never handled" for d in never] + [f"{d}: handled twice or more" for d in twice],
        ),
        Row(
            f"signal still waiting more than {grace:.0f} s after its deadline",
            len(stuck),
            [f"{sid}: {age:.1f} s past its deadline" for sid, age in stuck],
        ),
        Row("signal the API never created (retried 60 s)", len(not_created), not_created),
        Row(
            "a message consumed more than once in a namespace, or a signal twice",
            len(consumed_twice),
            [f"{m}: {n} receipts" for m, n in consumed_twice],
        ),
    ]

    statuses = Counter(r["status"] for r in db.values())
    reasons = Counter(r["reason"] for r in db.values() if r["reason"])
    lateness = sorted(
        r["expired_at"] - r["expires_at"]
        for r in db.values()
        if r["expired_at"] is not None and r["reason"] == "deadline"
    )
    info = [
        ("signals", f"{len(signals)} created ({dict(sorted(statuses.items()))})"),
        ("expiry reasons", str(dict(sorted(reasons.items())))),
        ("expected found", f"{expected} (matching mail held >= 1 s before the deadline)"),
        ("lost", f"{len(lost)} by provider/fate: {dict(sorted(lost_by.items()))}"),
        (
            "excused",
            f"{excused} (their provider was down between the mail and the deadline,"
            " or never answered a look begun after the mail before it went down)",
        ),
        ("duplicated", str(len(dupes))),
        ("last second", f"{last_second_found}/{last_second} found (mail < 1 s before deadline)"),
        ("dead letters", f"{len(dl_rows)} ({unpublished} never marked published)"),
        ("ended", _ended(signals, db)),
        ("consumers", str(dict(sorted(record.get("consumes", {}).items())))),
    ]
    lags = sorted(
        m["acked"] - m["planned"]
        for m in record["mails"]
        if m.get("acked") is not None and m.get("planned") and m["kind"] != "busy"
    )
    if lags:
        info.append(
            (
                "delivery lag",
                f"p50 {statistics.median(lags):.2f} s, max {lags[-1]:.2f} s"
                " (provider acknowledged - planned instant: retries while a provider was down)",
            )
        )
    crashes = record.get("crashes", [])
    if crashes:
        info.append(
            (
                "process exits",
                f"{len(crashes)} Signalbox processes exited on their own and were started"
                " again: "
                + ", ".join(
                    f"{c['process']} at {c['at']:.0f} s (code {c['code']})" for c in crashes
                ),
            )
        )
    if lateness:
        info.append(
            (
                "expiry lateness",
                f"p50 {statistics.median(lateness):.2f} s, max {lateness[-1]:.2f} s"
                " (expired_at - expires_at, reason deadline)",
            )
        )
    return Report(rows=rows, info=info)


def _ended(signals: Sequence[Mapping[str, Any]], db: Mapping[str, Any]) -> str:
    """Created = ended = one outcome each, for the signals the soak created."""
    rows = [db[s["signal_id"]] for s in signals if s["signal_id"] in db]
    found = sum(1 for r in rows if r["status"] in FOUND and r["message_id"])
    expired = sum(1 for r in rows if r["status"] == "expired")
    consumed = sum(1 for r in rows if r["status"] == "consumed")
    return (
        f"{len(signals)} created, {found + expired} ended: {found} found"
        f" ({consumed} of them consumed) + {expired} expired"
    )


def _not_for(
    s: Mapping[str, Any], mail: Mapping[str, Any] | None, row: Mapping[str, Any], offset: float
) -> str | None:
    """Why `mail` may not satisfy signal `s`, or None if it may."""
    if mail is None:
        return f"its message ({row['subject']!r}) is none the soak sent"
    if mail["recipient"].lower() != s["recipient"].lower():
        return f"{mail['mail_id']} went to another address"
    marker = mail.get("run_marker")
    if marker is not None and marker != s["run_id"]:
        return f"{mail['mail_id']} carries another run's marker ({marker})"
    if marker is None and s["require_run_marker"]:
        return f"{mail['mail_id']} has no run marker and the signal requires one"
    wanted = s.get("subject_contains")
    if wanted and wanted.lower() not in mail["subject"].lower():
        return f"{mail['mail_id']} subject {mail['subject']!r} lacks {wanted!r}"
    acked = mail.get("acked")
    if acked is None:
        return None  # delivery outcome unknown (the connection broke after DATA)
    if mail.get("sent_before_create") and acked < float(s["created_wall"]) - CLOCK_SLACK:
        return f"{mail['mail_id']} ({mail['kind']}) arrived before the window opened"
    deadline = row["expires_at"] - offset
    # The provider stamped it while the acknowledged delivery was in flight,
    # which a provider coming back from an outage can stretch past the
    # deadline: it came late for certain only if that delivery began late.
    # A failed attempt before it may have been stored (its commit made, its
    # answer lost to a fault), stamped when that attempt began.
    sent = mail.get("first_sent", mail.get("sent", acked))
    if sent > deadline + CLOCK_SLACK:
        return f"{mail['mail_id']} was sent {sent - deadline:.1f} s after the deadline"
    return None


def main() -> int:
    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--alerts", type=Path, help="JSON {dead_letter_id: count}")
    args = parser.parse_args()
    record = json.loads(args.record.read_text())
    alerts = json.loads(args.alerts.read_text()) if args.alerts else record.get("alerts", {})
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        report = check(conn, record, alerts)
    print(report.render())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
