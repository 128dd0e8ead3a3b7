"""The soak's plan, drawn from a seed before anything runs: which signals, on
which provider, address and run, with which window and budget, and which mail
each one gets and when. Pure: the same arguments give the same plan.

Mail times are relative to the signal: `after_created` (seconds after the
creation answer), `before_deadline` (seconds before its deadline), or
`after_deadline`. The runner turns them into instants once the signal exists.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench.soak_world import NAMESPACES, PROVIDER_NAMES

# What the matching mail of a signal does (its "fate"), with weights.
FATES = {
    "early": 0.12,  # within the first second of the window (same second as received_after)
    "mid": 0.38,  # anywhere in the window
    "last2": 0.15,  # 2.0 to 1.2 s before the deadline
    "last1": 0.08,  # in the last second before the deadline (reported, not an invariant)
    "late": 0.12,  # 2 to 4 s after the deadline: must not be found
    "none": 0.15,  # no matching mail: must expire
}


@dataclass
class PlannedMail:
    mail_id: str
    provider: str  # the Signalbox provider name (sink, catcher, corp-imap)
    recipient: str
    subject: str
    run_marker: str | None
    kind: str  # match, before_window, other_run, wrong_subject, markerless_shared, busy
    signal_key: str | None  # the signal this mail is meant for (match), else None
    after_created: float | None = None
    before_deadline: float | None = None
    after_deadline: float | None = None
    before_created: float | None = None


@dataclass
class PlannedSignal:
    key: str
    namespace: str
    run_id: str
    test_case: str
    provider: str
    recipient: str
    subject_contains: str | None
    require_run_marker: bool
    window: int
    max_checks: int
    create_at: float  # seconds after the start of the active phase
    fate: str
    group: str  # "private", "shared", "busy"
    mails: list[PlannedMail] = field(default_factory=list)


@dataclass
class Plan:
    signals: list[PlannedSignal]
    busy_mail: list[PlannedMail]  # delivered before any signal exists
    seed: int


def scheduled_checks_bound(
    window: float, *, base: float, cap: float, coalesce: float, jitter: float = 0.2
) -> int:
    """How many checks the schedule alone can ask for in `window` seconds, at most.

    Every wait is taken at its shortest (full negative jitter) and shortened
    again by the coalescing window (a signal due soon rides along with another
    signal's check); the first check and a last one at the deadline are added.
    """
    checks, elapsed = 1, 0.0
    while True:
        wait = min(base * 2 ** (checks - 1), cap) * (1 - jitter) - coalesce
        elapsed += max(0.2, wait)
        if elapsed > window:
            return checks + 1
        checks += 1


def make_plan(  # noqa: C901 - one seeded plan; splitting it moves the rng
    *,
    signals: int,
    duration: float,
    providers: list[str],
    seed: int,
    window_min: int,
    window_max: int,
    base: float,
    cap: float,
    coalesce: float,
    budget_margin: int = 8,
    busy_messages: int = 0,
    busy_maildev: int = 0,
    runs_per_namespace: int = 3,
) -> Plan:
    rng = random.Random(seed)
    names = [PROVIDER_NAMES[p] for p in providers]
    runs = [(ns, f"soak{seed}-{ns}-r{k}") for ns in NAMESPACES for k in range(runs_per_namespace)]
    mail_seq = iter(range(1, 10**9))

    def mail_id() -> str:
        return f"m{next(mail_seq):06d}"

    out: list[PlannedSignal] = []
    busy_mail: list[PlannedMail] = []
    # IMAP has none: every IMAP check fetches the whole folder's recent mail anyway.
    busy_counts = {"sink": busy_messages, PROVIDER_NAMES["maildev"]: busy_maildev}
    busy_addresses = {
        name: f"busy-{name}@soak.test" for name in names if busy_counts.get(name, 0) > 0
    }
    for name, address in busy_addresses.items():
        for _ in range(busy_counts[name]):
            busy_mail.append(
                PlannedMail(mail_id(), name, address, "Weekly digest", None, "busy", None)
            )

    index = 0
    while index < signals:
        provider = names[index % len(names)] if rng.random() < 0.7 else rng.choice(names)
        roll = rng.random()
        if roll < 0.25:
            group, size = "shared", rng.randint(2, 4)
            recipient = f"shared-{index:05d}@soak.test"
        elif roll < 0.32 and provider in busy_addresses:
            group, size = "busy", rng.randint(1, 3)
            recipient = busy_addresses[provider]
        else:
            group, size = "private", 1
            recipient = f"user-{index:05d}-{rng.randrange(16**6):06x}@soak.test"
        size = min(size, signals - index)
        group_runs = rng.sample(runs, size)
        create_at = rng.uniform(0, duration)
        for ns, run_id in group_runs:
            key = f"s{index:05d}"
            window = rng.randint(window_min, window_max)
            fate = rng.choices(list(FATES), weights=list(FATES.values()))[0]
            if group == "private":
                subject_contains = None if rng.random() < 0.3 else f"code {key}"
                require_marker = rng.random() < 0.2
            elif group == "shared":
                subject_contains = "Sign in"
                require_marker = rng.random() < 0.3
            else:
                # The busy address is shared by every busy group over the whole
                # run: two of them may draw the same run, and signals with the
                # same criteria on one address are interchangeable (either may
                # take the other's mail), so each busy signal names its own.
                subject_contains = f"Sign in {key}"
                require_marker = rng.random() < 0.3
            budget = (
                scheduled_checks_bound(window, base=base, cap=cap, coalesce=coalesce)
                + budget_margin
            )
            signal = PlannedSignal(
                key=key,
                namespace=ns,
                run_id=run_id,
                test_case=f"case-{key}",
                provider=provider,
                recipient=recipient,
                subject_contains=subject_contains,
                require_run_marker=require_marker,
                window=window,
                max_checks=budget,
                create_at=min(duration, create_at + rng.uniform(0, 1.0)),
                fate=fate,
                group=group,
            )
            subject = f"{subject_contains or 'Welcome'} #{{mail}}"
            # A marker whenever the address is shared (or the signal requires one).
            marker = (
                run_id if (group != "private" or require_marker or rng.random() < 0.5) else None
            )

            def add(
                kind: str,
                subj: str,
                run: str | None,
                for_me: bool,
                signal: PlannedSignal = signal,
                **when: float,
            ) -> None:
                mid = mail_id()
                signal.mails.append(
                    PlannedMail(
                        mid,
                        signal.provider,
                        signal.recipient,
                        subj.replace("{mail}", mid),
                        run,
                        kind,
                        signal.key if for_me else None,
                        **when,
                    )
                )

            if fate == "early":
                add("match", subject, marker, True, after_created=rng.uniform(0.05, 0.8))
            elif fate == "mid":
                add("match", subject, marker, True, after_created=rng.uniform(1.0, window - 2.5))
            elif fate == "last2":
                add("match", subject, marker, True, before_deadline=rng.uniform(1.2, 2.0))
            elif fate == "last1":
                add("match", subject, marker, True, before_deadline=rng.uniform(0.2, 0.9))
            elif fate == "late":
                add("match", subject, marker, True, after_deadline=rng.uniform(2.0, 4.0))
            if rng.random() < 0.15:  # the right mail, but before the window opened
                add("before_window", subject, marker or run_id, False, before_created=2.5)
            if rng.random() < 0.25:  # another run's mail to the same address
                add(
                    "other_run",
                    subject,
                    f"{run_id}-other",
                    False,
                    after_created=rng.uniform(0.0, window * 0.9),
                )
            if subject_contains and rng.random() < 0.10:
                add(
                    "wrong_subject",
                    "Unrelated notice #{mail}",
                    marker,
                    False,
                    after_created=rng.uniform(0.0, window * 0.9),
                )
            out.append(signal)
            index += 1
        if group != "private" and rng.random() < 0.3:
            # Unmarked mail to a shared address: any of its signals may take it.
            last = out[-1]
            mid = mail_id()
            last.mails.append(
                PlannedMail(
                    mid,
                    provider,
                    recipient,
                    f"Sign in #{mid}",
                    None,
                    "markerless_shared",
                    None,
                    after_created=rng.uniform(0.0, max(1.0, last.window * 0.5)),
                )
            )
    out.sort(key=lambda s: s.create_at)
    return Plan(signals=out, busy_mail=busy_mail, seed=seed)
