"""``signalbox``: the client CLI over the HTTP API (the server's docs/api.md, "CLI").

Exit codes: 0 success; 1 expired or refused (409/410, lease expired, an
expired or timed-out wait, 401/404); 2 usage error (bad arguments, a malformed
id, 422); 3 service unreachable (connection refused, timeouts, 5xx after retries).

Everything printed as text goes through :func:`signalbox.render.printable`:
terminal escape sequences and control characters from the server or an email
never reach the terminal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from signalbox import _core, message_cli, render
from signalbox.client import Signalbox
from signalbox.errors import (
    EmailArrived,
    InvalidRequest,
    ServiceUnavailable,
    SignalboxError,
    SignalExpired,
    WaitTimeout,
)
from signalbox.models import Signal

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

EPILOG = """\
exit codes:
  0  success
  1  expired or refused (409/410, lease expired, expired or timed-out wait, 401/404)
  2  usage error (bad arguments, a malformed id, 422 invalid input)
  3  service unreachable (connection refused, timeouts, 5xx after retries)
"""


def exit_code_for(exc: SignalboxError) -> int:
    """The process exit code for a client error."""
    if isinstance(exc, ServiceUnavailable):
        return EXIT_UNREACHABLE
    if isinstance(exc, InvalidRequest):
        return EXIT_USAGE
    return EXIT_REFUSED


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    # Registered on the main parser and on every subcommand so the options work
    # before or after the command; SUPPRESS keeps a subcommand's absent option
    # from overwriting a value given before it.
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--url",
        default=default,
        metavar="URL",
        help=f"API base URL (default: ${_core.URL_ENV}, else {_core.DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        default=default,
        metavar="TOKEN",
        help=f"API bearer token (default: ${_core.TOKEN_ENV})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print the API's JSON object instead of a table",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``signalbox`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="signalbox",
        description="Wait for an expected email as a contract (Signalbox client).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(
        name: str, help_text: str, parent: Any = sub, *, target: str | None = None
    ) -> argparse.ArgumentParser:
        """A subcommand with the global options; ``target`` names the id it acts on,
        a positional shown as that name in upper case (``SIGNAL_ID``)."""
        p: argparse.ArgumentParser = parent.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _global_options(p, suppress=True)
        if target is not None:
            p.add_argument(target, metavar=target.upper())
        return p

    p = command("mailbox", "create a fresh isolated mailbox for a run")
    p.add_argument("--run-id", required=True)
    p.add_argument("--provider", default="sink")

    p = command("watch", "declare an expected email (create a signal)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--test-case", required=True)
    p.add_argument("--recipient", required=True, metavar="ADDR")
    p.add_argument("--subject-contains", metavar="S")
    p.add_argument("--body-contains", metavar="S")
    p.add_argument("--expires-in", type=int, metavar="SECONDS")
    p.add_argument("--max-checks", type=int, metavar="N")
    p.add_argument("--provider", metavar="P")
    p.add_argument("--require-run-marker", action="store_true")
    p.add_argument(
        "--expect",
        choices=("first", "exactly_one", "none"),
        help="first (default): the first match; exactly_one: one and no second within"
        " --settle; none: no match before the deadline (wait exits 1 if one arrives)",
    )
    p.add_argument(
        "--settle",
        type=int,
        metavar="SECONDS",
        help="with --expect exactly_one: how long a second match is waited for (default 5)",
    )

    p = command(
        "wait", "block until the signal is found, expires, or --timeout passes", target="signal_id"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=_core.DEFAULT_WAIT_TIMEOUT,
        metavar="SECONDS",
        help="client-side limit (default: until the signal ends, found or expired)",
    )

    p = command(
        "cancel",
        "cancel a signal its test no longer waits for (no dead letter)",
        target="signal_id",
    )
    p.add_argument(
        "--reason",
        default="cancelled",
        metavar="TEXT",
        help="why, 1-200 characters (default: cancelled; the pytest plugin sends test_failed"
        " or test_ended)",
    )

    p = command(
        "claim", "lease the signal's message (prints untrusted email content)", target="signal_id"
    )
    p.add_argument("--run-id", required=True)
    p.add_argument("--lease", type=int, default=90, metavar="SECONDS")
    p.add_argument(
        "--owner", metavar="NAME", help="who holds the claim (default: the token's name)"
    )
    p.add_argument(
        "--save-attachments",
        metavar="DIR",
        help="also read the whole message and save its attachments into DIR",
    )

    p = command(
        "message", "print a claim's whole message (untrusted email content)", target="claim_id"
    )
    p.add_argument("--save-attachments", metavar="DIR", help="save its attachments into DIR")

    command("consume", "consume a claim and print its receipt", target="claim_id")

    command("evidence", "print a run's evidence artifact", target="run_id")

    dlq = command("dlq", "triage the dead-letter queue")
    dsub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION")
    p = command("list", "list dead letters (test case, reason and why of each)", dsub)
    _dlq_filters(p)
    p.add_argument("--state", metavar="S", help="open, redriven or discarded")
    p = command(
        "show", "show a dead letter's diagnosis (and a discarded one's note)", dsub, target="id"
    )
    p = command(
        "redrive",
        "send the signal back to waiting with a new deadline: one ID, or every open"
        " dead letter matching the filters",
        dsub,
    )
    p.add_argument("id", metavar="ID", nargs="?")
    _dlq_filters(p, bulk=True)
    p.add_argument("--expires-in", type=int, metavar="SECONDS")
    p.add_argument("--max-checks", type=int, metavar="N")
    p = command(
        "discard",
        "close a dead letter without redriving it: one ID, or every open one matching the filters",
        dsub,
    )
    p.add_argument("id", metavar="ID", nargs="?")
    _dlq_filters(p, bulk=True)
    p.add_argument("--note", required=True, metavar="TEXT")

    command("mcp", "run the MCP server over stdio (tools for LLM agents)")
    return parser


# The dead-letter filters of `dlq list` and of the bulk `dlq redrive` / `dlq discard`.
DLQ_FILTERS = ("run_id", "test_case", "reason", "provider", "why")


def _dlq_filters(p: argparse.ArgumentParser, *, bulk: bool = False) -> None:
    p.add_argument("--run-id", metavar="R")
    p.add_argument("--test-case", metavar="T", help="the test case exactly (a pytest node id)")
    p.add_argument("--reason", metavar="R", help="deadline, check_budget, provider_errors, ...")
    p.add_argument("--provider", metavar="P")
    p.add_argument("--why", metavar="W", help="the first near miss's why, or none")
    if bulk:
        p.add_argument(
            "--limit", type=int, default=50, metavar="N", help="at most N (1-500, default 50)"
        )


def _dlq_filter_of(args: argparse.Namespace) -> dict[str, str]:
    return {k: getattr(args, k) for k in DLQ_FILTERS if getattr(args, k, None) is not None}


def printable_label(text: str) -> str:
    return " ".join(render.printable(text).split())


class Spinner:
    """A progress line on ``stream`` while a wait blocks, only when it is a TTY."""

    FRAMES = "|/-\\"

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label = printable_label(label)
        self.status = "waiting"
        self.stream = stream
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, signal: Signal) -> None:
        self.status = f"{signal.result}, {signal.checks}/{signal.max_checks} checks"

    def _run(self) -> None:
        for frame in itertools.cycle(self.FRAMES):
            self.stream.write(f"\r{frame} {self.label} ({self.status}) ")
            self.stream.flush()
            if self._stop.wait(0.1):
                break
        self.stream.write("\r\x1b[K")
        self.stream.flush()

    def __enter__(self) -> Spinner:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class _Output:
    def __init__(self, as_json: bool, out: TextIO) -> None:
        self.as_json = as_json
        self.out = out

    def emit(self, raw: Any, text: str) -> None:
        if self.as_json:
            # json.dumps escapes every control character (ensure_ascii).
            self.out.write(json.dumps(raw, indent=2, sort_keys=True) + "\n")
        else:
            self.out.write(render.printable(text) + "\n")


def _run(args: argparse.Namespace, client: Signalbox, out: _Output, err: TextIO) -> int:
    cmd = args.command
    if cmd == "mailbox":
        m = client.mailbox(args.run_id, args.provider)
        out.emit(m.raw, render.mailbox(m))
    elif cmd == "watch":
        h = client.watch(
            args.run_id,
            args.test_case,
            args.recipient,
            subject_contains=args.subject_contains,
            body_contains=args.body_contains,
            expires_in_seconds=args.expires_in,
            max_checks=args.max_checks,
            provider=args.provider,
            require_run_marker=args.require_run_marker,
            expect=args.expect,
            settle_seconds=args.settle,
        )
        out.emit(h.signal.raw, render.signal(h.signal))
    elif cmd == "wait":
        with Spinner(f"waiting for {args.signal_id}", err) as spinner:
            s = client.wait(args.signal_id, timeout=args.timeout, on_poll=spinner.update)
        out.emit(s.raw, render.signal(s))
    elif cmd == "cancel":
        s = client.cancel(args.signal_id, args.reason)
        out.emit(s.raw, render.signal(s))
    elif cmd == "claim":
        lease = client.claim(args.signal_id, args.run_id, args.lease, owner=args.owner)
        if args.save_attachments:
            saved = message_cli.save_attachments(lease.message(), args.save_attachments)
            raw = {**lease.claim.raw, "saved_attachments": [str(p) for p in saved]}
            text = render.claim(lease.claim) + "\nsaved:\n" + "\n".join(map(str, saved))
            out.emit(raw, text)
        else:
            out.emit(lease.claim.raw, render.claim(lease.claim))
    elif cmd == "message":
        whole = client.message(args.claim_id)
        where = args.save_attachments
        saved = message_cli.save_attachments(whole, where) if where else []
        raw = {**whole.raw, "saved_attachments": [str(p) for p in saved]} if saved else whole.raw
        out.emit(raw, message_cli.render_message(whole, saved))
    elif cmd == "consume":
        r = client.consume(args.claim_id)
        out.emit(r.raw, render.receipt(r))
    elif cmd == "evidence":
        e = client.evidence(args.run_id)
        out.emit(e.raw, render.evidence(e))
    elif cmd == "dlq":
        return _dlq(args, client, out)
    return EXIT_OK


def _dlq(args: argparse.Namespace, client: Signalbox, out: _Output) -> int:
    action = args.dlq_command
    chosen = _dlq_filter_of(args)
    if action == "list":
        page = client.dead_letters(args.state, **chosen)
        raw = {"items": [d.raw for d in page.items], "next_cursor": page.next_cursor}
        out.emit(raw, render.dead_letters(page.items, page.next_cursor))
    elif action == "show":
        d = client.dead_letter(args.id)
        out.emit(d.raw, render.dead_letter(d))
    elif (args.id is None) == (not chosen):
        raise InvalidRequest(
            f"dlq {action}: give one dead letter ID, or filters (--run-id, --test-case,"
            " --reason, --provider, --why) for every open one that matches, not both"
        )
    elif action == "redrive" and args.id:
        h = client.redrive(args.id, args.expires_in, args.max_checks)
        out.emit(h.signal.raw, render.signal(h.signal))
    elif action == "redrive":
        done = client.redrive_many(
            chosen, limit=args.limit, expires_in_seconds=args.expires_in, max_checks=args.max_checks
        )
        out.emit(done, render.bulk("redriven", done))
    elif action == "discard" and args.id:
        discarded = client.discard(args.id, args.note)
        raw = discarded.raw if discarded else {"dead_letter_id": args.id, "state": "discarded"}
        out.emit(raw, render.dead_letter(discarded) if discarded else f"discarded {args.id}")
    else:
        done = client.discard_many(chosen, args.note, limit=args.limit)
        out.emit(done, render.bulk("discarded", done))
    return EXIT_OK


def _report(exc: SignalboxError, out: _Output, err: TextIO) -> int:
    err.write(render.printable(f"signalbox: {exc.message}") + "\n")
    if isinstance(exc, SignalExpired) and exc.dead_letter is not None and not out.as_json:
        err.write(render.printable(render.dead_letter(exc.dead_letter)) + "\n")
    if out.as_json:
        body = exc.body
        if isinstance(exc, SignalExpired | WaitTimeout | EmailArrived) and exc.signal is not None:
            body = exc.signal.raw
        if isinstance(body, dict):
            out.emit(body, "")
    return exit_code_for(exc)


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    client_factory: Callable[[str | None, str | None], Signalbox] = Signalbox,
) -> int:
    """Run the CLI; returns the exit code (the console script passes it to ``sys.exit``)."""
    out_stream = stdout or sys.stdout
    err_stream = stderr or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, a usage error 2
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command is None or (args.command == "dlq" and args.dlq_command is None):
        parser.print_usage(err_stream)
        err_stream.write("signalbox: error: a command is required\n")
        return EXIT_USAGE
    url, token = getattr(args, "url", None), getattr(args, "token", None)
    if args.command == "mcp":
        from signalbox.mcp_server import run_stdio

        run_stdio(url, token)
        return EXIT_OK
    out = _Output(bool(getattr(args, "json", False)), out_stream)
    client = client_factory(url, token)
    try:
        return _run(args, client, out, err_stream)
    except SignalboxError as exc:
        return _report(exc, out, err_stream)
    except KeyboardInterrupt:
        err_stream.write("signalbox: interrupted\n")
        return 130
    finally:
        client.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
