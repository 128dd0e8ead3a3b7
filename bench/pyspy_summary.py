"""Summarise a py-spy `--format raw` (collapsed stacks) profile.

    uv run python bench/pyspy_summary.py PROFILE.txt [--top 25] [--idle]

Prints the share of samples per function, inclusive (the function or
anything it called was on the CPU) and self (the innermost frame). py-spy
samples idle threads too unless it ran with `--idle` off (the default): its
raw output then holds only samples of threads that were running Python or
native code, so shares are of the process's busy time.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _short(frame: str) -> str:
    """`func (path/to/file.py:123)` → `file.py:func` with the app's own paths kept."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("/app/", "/workers/", "site-packages/"):
        if marker in path:
            path = (
                path.split(marker, 1)[1]
                if marker == "site-packages/"
                else marker[1:] + (path.split(marker, 1)[1])
            )
            break
    else:
        path = Path(path).name
    return f"{path}:{m.group('func')}"


# Innermost frames that wait rather than compute: py-spy without `--gil`
# counts a thread blocked in them as active.
WAITS = (
    "connection.py:Connection.wait",
    "threading.py:Condition.wait",
    "threading.py:Event.wait",
    "threading.py:Thread.join",
    "selectors.py:EpollSelector.select",
    "selectors.py:PollSelector.select",
    "queue.py:Queue.get",
    "socket.py:SocketBuffer._read_from_socket",
    "socket.py:SocketIO.readinto",
    "ssl.py:SSLSocket.read",
    "time.py:sleep",
    "synchronize.py:Semaphore.acquire",
    "connection.py:Connection._recv",
    "connection.py:Connection._poll",
    "popen_fork.py:Popen.wait",
    "threading.py:Condition._acquire_restore",
)


def summarise(path: Path, top: int, busy: bool = False) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        # The first frame is the thread ("process N:..." / "thread (0x..)") in some versions.
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if busy and frames[-1] in WAITS:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    kind = "busy samples (waits dropped)" if busy else "samples"
    out = [f"{path}: {total} {kind}"]
    out.append("  inclusive")
    for f, n in inclusive.most_common(top):
        out.append(f"    {n / total * 100:5.1f} %  {f}")
    out.append("  self")
    for f, n in own.most_common(top):
        out.append(f"    {n / total * 100:5.1f} %  {f}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--busy",
        action="store_true",
        help="drop samples whose innermost frame is a known wait (socket, lock, queue, select)",
    )
    args = parser.parse_args()
    for p in args.profiles:
        print(summarise(p, args.top, busy=args.busy))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
