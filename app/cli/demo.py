"""`signalbox-server demo`: one signal end to end against the running stack.

It talks to the API the way a client does: `SIGNALBOX_URL` and
`SIGNALBOX_TOKEN` (what `up`'s banner tells you to export) first, else this
machine's settings (SIGNALBOX_API_HOST/_PORT, the first of SIGNALBOX_API_TOKENS,
or the dev token `up` keeps in the data directory). The mail goes to the sink at
SIGNALBOX_SMTP_HOST/_PORT.
"""

from __future__ import annotations

import argparse
import os
import smtplib
import sys
import time
import uuid
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any

from app.cli.up import DEV_TOKEN_FILE
from app.settings import Settings, get_settings

if TYPE_CHECKING:
    import httpx

URL_ENV = "SIGNALBOX_URL"
TOKEN_ENV = "SIGNALBOX_TOKEN"
# Exit codes: 1 the email was not found, 2 no token, 3 Signalbox could not be reached
# or refused a call (one line on stderr says which and what to do).
UNREACHABLE = 3


class DemoFailed(Exception):
    """A step of the demo failed; the message is the one line the user sees."""


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(get_settings())


def demo_target(
    settings: Settings, environ: dict[str, str] | None = None
) -> tuple[str, str | None]:
    """The API base URL and token the demo uses (see the module docstring)."""
    env = os.environ if environ is None else environ
    base = (env.get(URL_ENV) or f"http://{settings.api_host}:{settings.api_port}").rstrip("/")
    token = env.get(TOKEN_ENV) or next(iter(settings.token_map), None)
    token_file = settings.data_dir / DEV_TOKEN_FILE
    if not token and token_file.exists():
        token = token_file.read_text().strip()
    return base, token or None


def run_demo(settings: Settings) -> int:
    """Create a signal, send its email, wait for it, claim and consume it, and
    print each step; 1 if the email was not found, 2 without a token, 3 when
    the API or the sink cannot be reached (one line, no traceback)."""
    base, token = demo_target(settings)
    if not token:
        print(
            f"demo: no token; export {TOKEN_ENV} (up's banner prints it),"
            " set SIGNALBOX_API_TOKENS, or run `signalbox-server up` first",
            file=sys.stderr,
        )
        return 2
    try:
        return _demo(settings, base, token)
    except DemoFailed as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return UNREACHABLE


def _demo(settings: Settings, base: str, token: str) -> int:
    # Here, not at the top: every command imports this module for its parser.
    import httpx

    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    recipient = f"demo+{run_id}@example.test"
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=70
    ) as api:

        def call(method: str, path: str, **kw: Any) -> Any:
            return _call(api, base, method, path, **kw)

        signal = call(
            "POST",
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "demo",
                "recipient": recipient,
                "subject_contains": "verify",
                "expires_in_seconds": 60,
            },
        )
        print(f"signal {signal['signal_id']} created for run {run_id}: {signal['result']}")
        started = time.monotonic()
        _send(settings, recipient, run_id)
        view = call("GET", f"/v1/signals/{signal['signal_id']}", params={"wait": 30})
        print(f"result {view['result']} after {time.monotonic() - started:.2f} s")
        if view["result"] != "found":
            print(
                f"demo: the email went to the sink at {settings.smtp_host}:{settings.smtp_port}"
                f" and did not reach this stack's signal: is that this stack's sink? Export"
                f" SIGNALBOX_SMTP_HOST/_PORT as `up`'s banner prints them",
                file=sys.stderr,
            )
            return 1
        claim = call("POST", f"/v1/signals/{signal['signal_id']}/claim", json={"run_id": run_id})
        links, codes = len(claim["links"]), len(claim["codes"])
        print(f"claimed {claim['claim_id']}: {links} link(s), {codes} code(s)")
        receipt = call("POST", f"/v1/claims/{claim['claim_id']}/consume")
        print(f"consumed: receipt {receipt['receipt_id']}")
        evidence = call("GET", f"/v1/runs/{run_id}/evidence")
        print(f"evidence: {evidence['summary']}")
    return 0


def _call(api: httpx.Client, base: str, method: str, path: str, **kw: Any) -> Any:
    """One API call's JSON; a connection error or an error answer is a `DemoFailed`."""
    import httpx

    try:
        response = api.request(method, path, **kw)
    except httpx.TransportError as exc:
        raise DemoFailed(
            f"cannot reach Signalbox at {base} ({type(exc).__name__}): is `signalbox-server up`"
            f" running? Else export {URL_ENV} to its API address"
        ) from None
    if response.status_code >= 400:
        detail = response.text[:200].replace("\n", " ")
        hint = f" (check {TOKEN_ENV})" if response.status_code == 401 else ""
        raise DemoFailed(
            f"{method} {path} answered {response.status_code}{hint}: {detail}"
        ) from None
    return response.json()


def _send(settings: Settings, recipient: str, run_id: str) -> None:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "app@example.test", recipient, "Please verify"
    msg["X-Signalbox-Run"] = run_id
    msg.set_content("Your code is 482913. Open https://example.test/verify?t=demo to finish.")
    try:
        with smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=10) as smtp:
            smtp.send_message(msg)
    except (OSError, smtplib.SMTPException) as exc:
        raise DemoFailed(
            f"cannot send the demo email to the sink at {settings.smtp_host}:"
            f"{settings.smtp_port} ({type(exc).__name__}): set SIGNALBOX_SMTP_HOST/_PORT"
            " to the sink's address"
        ) from None
