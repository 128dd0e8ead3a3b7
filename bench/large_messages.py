"""Large messages: peak resident memory of the sink and the API while 8 SMTP
connections send 25 MiB messages with attachments and a client downloads them.

    uv run python bench/large_messages.py [--connections 8] [--rounds 2] [--mib 25]

Starts `signalbox-server up` (embedded PostgreSQL and Redis, no Flower). Each
round, `--connections` threads each create a signal on a fresh address and
send one message of about `--mib` MiB (a short text part and two binary
attachments, base64 as mail clients send them) on its own SMTP connection, all
at once. A client thread claims each found signal, reads
`GET /v1/claims/{id}/message`, downloads both attachments (streamed, checked
against the SHA-256 sent) and consumes, while the next round is sending.

The resident set (VmRSS) of the API and of the sink is sampled every 20 ms,
for each one's process tree (the API's uvicorn workers under `up`; the sink's
parse processes) and for its largest process; the figures are the resting
size before the load, the peak, and the peak above rest in copies of one
message (all connections together: divide by `--connections` for one). A
benchmark prints figures; it asserts nothing about them.
"""

from __future__ import annotations

import argparse
import email.policy
import hashlib
import os
import smtplib
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _machine
import _stack

MIB = 1024 * 1024


# One sink process, whatever the caller's SIGNALBOX_SMTP_PROCESSES: the
# figure is the peak of a process (with its parse pool), and one process
# taking every connection is its worst case.
ONE_SINK = {"SIGNALBOX_SMTP_PROCESSES": "1"}


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


class Sampler(threading.Thread):
    """Peak VmRSS of each named process tree (the process and its children:
    the API's uvicorn workers under `up`, the sink's parse processes) and of
    its largest member, every 20 ms."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        names = [f"{n} {what}" for n in pids for what in ("tree", "largest process")]
        self.peak: dict[str, int] = dict.fromkeys(names, 0)
        self.stop_event = threading.Event()

    def sample(self) -> dict[str, int]:
        now: dict[str, int] = {}
        for name, pid in self.pids.items():
            members = [rss_kib(pid), *(rss_kib(c) for c in children(pid))]
            now[f"{name} tree"] = sum(members)
            now[f"{name} largest process"] = max(members)
        return now

    def run(self) -> None:
        while not self.stop_event.wait(0.02):
            for name, kib in self.sample().items():
                self.peak[name] = max(self.peak[name], kib)


def large_message(recipient: str, mib: float) -> tuple[bytes, list[bytes]]:
    # base64 in 76-character lines grows 57 bytes to 78: what fits in `mib`.
    decoded = int(mib * MIB * 57 / 78) - 64 * 1024
    files = [b"%PDF-1.7\n" + os.urandom(decoded // 2), os.urandom(decoded - decoded // 2)]
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = "reports@example.test"
    msg["To"] = recipient
    msg["Subject"] = f"Export {uuid.uuid4().hex[:8]}"
    msg.set_content("The export is attached.\n")
    msg.add_attachment(files[0], maintype="application", subtype="pdf", filename="export.pdf")
    msg.add_attachment(files[1], maintype="application", subtype="zip", filename="data.zip")
    return msg.as_bytes(), files


def hwm_kib(pid: int) -> int:
    """The process's peak resident set so far (VmHWM), KiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def one_address(args: argparse.Namespace) -> int:
    """`--one-address N`: N messages of `--mib` to one address that signals
    watch (some find one of them, some wait and expire, one watches a typo
    of it), while a client lists the run's signals: the peak resident set of
    every process of the stack (issue 45)."""
    with _stack.running_stack(flower=False, env_extra=ONE_SINK) as stack:
        kinds = ("api", "smtp", "worker", "beat")
        pids = {k: stack.processes.pid(k) for k in kinds}
        assert all(pids.values()), pids
        time.sleep(2)
        sampler = Sampler(pids)  # type: ignore[arg-type]
        rest = sampler.sample()
        sampler.start()
        api = httpx.Client(
            base_url=stack.api_url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=300
        )
        run_id = f"one-{uuid.uuid4().hex[:8]}"
        address = f"exports-{uuid.uuid4().hex[:6]}@example.test"
        typo = address.replace("exports-", "exprots-")
        n = args.one_address
        wanted = {n // 4: "found", (3 * n) // 4: "found"}
        signals: dict[str, str] = {}

        def create(case: str, recipient: str, expect: str, **fields: object) -> None:
            body = {"run_id": run_id, "test_case": case, "recipient": recipient, **fields}
            r = api.post("/v1/signals", json=body)
            r.raise_for_status()
            signals[r.json()["signal_id"]] = expect

        for i, expect in wanted.items():
            create(f"finds-{i}", address, expect, subject_contains=f"Export {i:03d} ready",
                   expires_in_seconds=600)  # fmt: skip
        for i in range(3):
            create(f"waits-{i}", address, "expired", subject_contains="never sent",
                   expires_in_seconds=args.expire_after)  # fmt: skip
        create("typo", typo, "expired", expires_in_seconds=args.expire_after)
        template, _ = large_message(address, args.mib)
        subject = template[
            template.index(b"Subject: ") : template.index(b"\r\n", template.index(b"Subject: "))
        ]
        listed = 0
        stop = threading.Event()

        def lister() -> None:
            nonlocal listed
            while not stop.wait(0.5):
                api.get("/v1/signals", params={"run_id": run_id}).raise_for_status()
                listed += 1

        listing = threading.Thread(target=lister, daemon=True)
        listing.start()
        started = time.monotonic()
        with smtplib.SMTP(_stack.HOST, stack.smtp_port, timeout=300) as smtp:
            for i in range(n):
                raw = template.replace(subject, f"Subject: Export {i:03d} ready".encode(), 1)
                smtp.sendmail("reports@example.test", [address], raw)
        sent = time.monotonic() - started
        ends: dict[str, str] = {}
        deadline = time.monotonic() + args.expire_after + 300
        while len(ends) < len(signals) and time.monotonic() < deadline:
            for sid in signals:
                if sid not in ends:
                    status = api.get(f"/v1/signals/{sid}").json()["status"]
                    if status not in ("waiting", "provider_error"):
                        ends[sid] = status
            time.sleep(1)
        elapsed = time.monotonic() - started
        stop.set()
        sampler.stop_event.set()
        sampler.join()
        peaks = {k: max([hwm_kib(p), *(hwm_kib(c) for c in children(p))]) for k, p in pids.items()}  # type: ignore[arg-type]
        wrong = {
            sid: (ends.get(sid), want) for sid, want in signals.items() if ends.get(sid) != want
        }
        api.close()
    print()
    print("Large messages to one watched address: peak resident memory of every process")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/large_messages.py', *sys.argv[1:]])}")
    print(f"  load        {n} messages of {len(template) / MIB:.1f} MiB to one address,"
          f" sent in {sent:.0f} s; {len(signals)} signals, all ended in {elapsed:.0f} s;"
          f" listed {listed} times")  # fmt: skip
    print(f"  signals     {len(signals) - len(wrong)} ended as expected; wrong: {wrong or 'none'}")
    print()
    rows = []
    for kind in kinds:
        largest = f"{kind} largest process"
        tree = f"{kind} tree"
        rows.append((kind, f"{rest[largest] / 1024:.0f}", f"{sampler.peak[largest] / 1024:.0f}",
                     f"{peaks[kind] / 1024:.0f}", f"{sampler.peak[tree] / 1024:.0f}"))  # fmt: skip
    print(
        _stack.table(
            rows, ("process", "rest MiB", "peak VmRSS MiB", "peak VmHWM MiB", "tree peak MiB")
        )
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", type=float, default=25.0)
    parser.add_argument("--one-address", type=int, default=0, metavar="N",
                        help="N messages to one watched address instead (issue 45)")  # fmt: skip
    parser.add_argument("--expire-after", type=int, default=45,
                        help="--one-address: seconds until the waiting signals expire")  # fmt: skip
    args = parser.parse_args()
    if args.one_address:
        return one_address(args)
    print("starting signalbox-server up ...", flush=True)
    with _stack.running_stack(flower=False, env_extra=ONE_SINK) as stack:
        pids = {"api": stack.processes.pid("api"), "smtp": stack.processes.pid("smtp")}
        assert all(pids.values()), pids
        time.sleep(2)  # let start-up settle before the resting figure
        sampler = Sampler(pids)  # type: ignore[arg-type]
        rest = sampler.sample()
        sampler.start()
        headers = {"Authorization": f"Bearer {stack.token}"}
        api = httpx.Client(base_url=stack.api_url, headers=headers, timeout=300)
        found: list[tuple[str, str, list[bytes]]] = []
        lock = threading.Condition()
        sent_total = 0
        size = 0
        errors: list[str] = []

        def send(i: int) -> None:
            nonlocal sent_total, size
            run_id = f"large-{uuid.uuid4().hex[:8]}"
            recipient = f"export-{run_id}-{i}@example.test"
            raw, files = large_message(recipient, args.mib)
            signal = api.post(
                "/v1/signals",
                json={"run_id": run_id, "test_case": f"case-{i}", "recipient": recipient,
                      "expires_in_seconds": 600},
            ).json()  # fmt: skip
            with smtplib.SMTP(_stack.HOST, stack.smtp_port, timeout=300) as smtp:
                smtp.sendmail("reports@example.test", [recipient], raw)
            with lock:
                sent_total += 1
                size = len(raw)
                found.append((signal["signal_id"], run_id, files))
                lock.notify_all()

        downloaded = 0

        def download(expected: int) -> None:
            nonlocal downloaded
            while downloaded < expected:
                with lock:
                    while not found:
                        lock.wait(1)
                    signal_id, run_id, files = found.pop(0)
                view = api.get(f"/v1/signals/{signal_id}", params={"wait": 60}).json()
                if view["status"] != "found":
                    errors.append(f"{signal_id}: {view['status']}")
                    downloaded += 1
                    continue
                claim = api.post(f"/v1/signals/{signal_id}/claim", json={"run_id": run_id}).json()
                cid = claim["claim_id"]
                listed = api.get(f"/v1/claims/{cid}/message").json()["attachments"]
                for item, sent in zip(listed, files, strict=True):
                    digest = hashlib.sha256()
                    with api.stream(
                        "GET", f"/v1/claims/{cid}/attachments/{item['attachment_id']}"
                    ) as r:
                        for chunk in r.iter_bytes():
                            digest.update(chunk)
                    if digest.hexdigest() != hashlib.sha256(sent).hexdigest():
                        errors.append(f"{signal_id}: attachment differs")
                api.post(f"/v1/claims/{cid}/consume")
                downloaded += 1

        total = args.connections * args.rounds
        started = time.monotonic()
        downloader = threading.Thread(target=download, args=(total,), daemon=True)
        downloader.start()
        for round_no in range(args.rounds):
            print(f"round {round_no + 1}: {args.connections} connections sending ...", flush=True)
            senders = [threading.Thread(target=send, args=(i,)) for i in range(args.connections)]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
        downloader.join(timeout=600)
        elapsed = time.monotonic() - started
        sampler.stop_event.set()
        sampler.join()
        machine = _machine.render(_machine.describe(stack.database_url(), stack.redis_url))
        api.close()

    print()
    print("Large messages: peak resident memory while 25 MiB messages arrive and are downloaded")
    print(f"  date        {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    print(f"  command     {' '.join(['bench/large_messages.py', *sys.argv[1:]])}")
    print(f"  message     {size} bytes ({size / MIB:.1f} MiB), 2 attachments (base64)")
    print(f"  load        {args.connections} connections x {args.rounds} rounds = {total} messages,"
          f" {downloaded} claimed and downloaded, {elapsed:.0f} s")  # fmt: skip
    print(f"  errors      {len(errors)} {errors[:3] if errors else ''}")
    print()
    rows = []
    for name in sampler.peak:
        above = (sampler.peak[name] - rest[name]) / 1024
        rows.append((name, f"{rest[name] / 1024:.0f}", f"{sampler.peak[name] / 1024:.0f}",
                     f"{above:.0f}", f"{above * MIB / size:.1f}" if size else "-"))  # fmt: skip
    print(_stack.table(rows, ("process", "rest MiB", "peak MiB", "above rest MiB", "copies")))
    print()
    print("machine")
    print(machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
