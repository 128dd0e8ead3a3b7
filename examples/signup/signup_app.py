"""A tiny signup web app that sends a verification email over SMTP.

``POST /signup`` (JSON ``{"email": ...}``) stores an unverified user and mails a
link to ``GET /verify?token=...``; ``GET /users?email=...`` shows the state.
Mail goes to ``$SIGNALBOX_SMTP_HOST``:``$SIGNALBOX_SMTP_PORT`` (Signalbox's SMTP
sink, 127.0.0.1:2525 by default). A request header ``X-Signalbox-Run`` is
copied onto the email so Signalbox can tie it to the test run that caused it.

Run it alone with ``python examples/signup/signup_app.py`` (port 8050).
"""

from __future__ import annotations

import json
import os
import secrets
import smtplib
import threading
import time
from dataclasses import dataclass
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SENDER = "Signup <noreply@signup.example>"
SUBJECT = "Verify your Signup account"
# A temporary refusal (4xx) is tried again, this many times in all, with a
# short pause that doubles: what a mail queue does, in miniature.
SEND_ATTEMPTS = 4
RETRY_PAUSE_SECONDS = 0.2


@dataclass
class User:
    email: str
    token: str
    verified: bool = False


class SignupApp:
    """The app: an HTTP server on ``host:port`` (0 picks a free port) and its users."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        smtp_host: str | None = None,
        smtp_port: int | None = None,
    ) -> None:
        self.smtp_host = smtp_host or os.environ.get("SIGNALBOX_SMTP_HOST", "127.0.0.1")
        self.smtp_port = smtp_port or int(os.environ.get("SIGNALBOX_SMTP_PORT", "2525"))
        self.users: dict[str, User] = {}
        # Every SMTP attempt's outcome, oldest first: "sent" or the refusal's code.
        self.send_log: list[str] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> SignupApp:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def signup(self, email: str, run_marker: str | None) -> User:
        user = User(email=email, token=secrets.token_urlsafe(16))
        with self._lock:
            self.users[email.lower()] = user
        self.send_verification(user, run_marker)
        return user

    def send_verification(self, user: User, run_marker: str | None) -> None:
        msg = EmailMessage()
        msg["From"] = SENDER
        msg["To"] = user.email
        msg["Subject"] = SUBJECT
        if run_marker:
            msg["X-Signalbox-Run"] = run_marker
        link = f"{self.base_url}/verify?token={user.token}"
        # 7bit keeps the link on one readable line in the raw message.
        msg.set_content(f"Welcome to Signup!\n\nConfirm your address: {link}\n", cte="7bit")
        pause = RETRY_PAUSE_SECONDS
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                with smtplib.SMTP(self.smtp_host, self.smtp_port, timeout=10) as smtp:
                    smtp.send_message(msg)
                self.send_log.append("sent")
                return
            except smtplib.SMTPResponseException as exc:  # DATA, MAIL FROM refused
                code = exc.smtp_code
            except smtplib.SMTPRecipientsRefused as exc:  # RCPT TO refused
                code = min(c for c, _ in exc.recipients.values())
            self.send_log.append(str(code))
            if not 400 <= code < 500 or attempt == SEND_ATTEMPTS:
                raise OSError(f"the mail server refused the email ({code})")
            time.sleep(pause)
            pause *= 2

    def verify(self, token: str) -> User | None:
        with self._lock:
            for user in self.users.values():
                if secrets.compare_digest(user.token, token):
                    user.verified = True
                    return user
        return None


def _handler(app: SignupApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/signup":
                return self._json(404, {"error": "not found"})
            length = int(self.headers.get("Content-Length") or 0)
            try:
                email = str(json.loads(self.rfile.read(length))["email"])
            except (ValueError, KeyError, TypeError):
                return self._json(422, {"error": 'send {"email": ...}'})
            try:
                user = app.signup(email, self.headers.get("X-Signalbox-Run"))
            except OSError as exc:
                return self._json(502, {"error": f"could not send the email: {exc}"})
            self._json(201, {"email": user.email, "verified": user.verified})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if url.path == "/verify":
                user = app.verify(query.get("token", [""])[0])
                if user is None:
                    return self._json(404, {"error": "unknown token"})
                return self._json(200, {"email": user.email, "verified": True})
            if url.path == "/users":
                found = app.users.get(query.get("email", [""])[0].lower())
                if found is None:
                    return self._json(404, {"error": "no such user"})
                return self._json(200, {"email": found.email, "verified": found.verified})
            self._json(404, {"error": "not found"})

    return Handler


if __name__ == "__main__":
    server = SignupApp(port=8050).start()
    print(f"signup app on {server.base_url}")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
