"""A private MailDev for one test: SMTP and its REST API on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers.base import (
    INSTALL_HINT,
    LOOPBACK,
    REPO_ROOT,
    MissingTestDependency,
    free_port,
    stop_process,
    wait_for_port,
)

MAILDEV_BIN = REPO_ROOT / ".signalbox" / "node" / "node_modules" / ".bin" / "maildev"


def find_maildev() -> Path:
    """The maildev launcher from scripts/install-test-deps.sh, or `MissingTestDependency`."""
    if not os.access(MAILDEV_BIN, os.X_OK):
        raise MissingTestDependency(f"maildev is not installed at {MAILDEV_BIN}: {INSTALL_HINT}")
    if shutil.which("node") is None:
        raise MissingTestDependency(f"node (Node.js) is not on PATH: {INSTALL_HINT}")
    return MAILDEV_BIN


@dataclass
class MaildevServer:
    """A running MailDev: SMTP on `smtp_port`, REST API at `url`.

    `stop()` then `start()` restarts it on the same ports; caught mail
    survives the restart (it is kept in `mail_dir`, ids unchanged).
    """

    smtp_port: int
    web_port: int
    url: str
    mail_dir: Path
    log_path: Path
    binary: Path
    host: str = LOOPBACK
    web_user: str | None = None
    web_pass: str | None = field(default=None, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start maildev and wait until both its SMTP and web ports accept."""
        if self.process is not None and self.process.poll() is None:
            return
        # MAILDEV_* variables would override the flags (outgoing relay, auth...).
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILDEV_")}
        command = [
            str(self.binary),
            *("--smtp", str(self.smtp_port), "--web", str(self.web_port)),
            *("--ip", self.host, "--web-ip", self.host),
            *("--mail-directory", str(self.mail_dir)),
            # No --outgoing-* and no --auto-relay: nothing caught is ever relayed.
        ]
        if self.web_user is not None:
            command += ["--web-user", self.web_user, "--web-pass", self.web_pass or ""]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        for port in (self.web_port, self.smtp_port):
            wait_for_port(self.host, port, process=self.process, log_path=self.log_path)

    def stop(self) -> None:
        """Stop maildev; its ports refuse connections afterwards."""
        stop_process(self.process)
        self.process = None


@contextlib.contextmanager
def maildev_server(
    tmp_path: Path | None = None, web_user: str | None = None, web_pass: str | None = None
) -> Iterator[MaildevServer]:
    """Start a private MailDev on free loopback ports, and stop it afterwards.

    With `web_user`/`web_pass` its web UI and REST API ask for HTTP basic auth.
    Logs go to ``tmp_path/maildev.log`` (a temporary directory without `tmp_path`).
    """
    binary = find_maildev()
    with contextlib.ExitStack() as stack:
        if tmp_path is None:
            tmp_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="maildev-")))
        mail_dir = tmp_path / "maildev-mail"
        mail_dir.mkdir(parents=True, exist_ok=True)
        smtp_port = free_port()
        web_port = free_port()
        while web_port == smtp_port:
            web_port = free_port()
        server = MaildevServer(
            smtp_port=smtp_port,
            web_port=web_port,
            url=f"http://{LOOPBACK}:{web_port}",
            mail_dir=mail_dir,
            log_path=tmp_path / "maildev.log",
            binary=binary,
            web_user=web_user,
            web_pass=web_pass,
        )
        try:
            server.start()
            yield server
        finally:
            server.stop()
