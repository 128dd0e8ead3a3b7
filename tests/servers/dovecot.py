"""A private Dovecot (IMAP) for one test: plain IMAP on a free loopback port,
one mailbox user, maildir storage."""

from __future__ import annotations

import contextlib
import imaplib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tests.servers.base import (
    INSTALL_HINT,
    LOOPBACK,
    MissingTestDependency,
    free_port,
    stop_process,
    wait_for_port,
)


def find_dovecot() -> str:
    """The dovecot binary, or `MissingTestDependency`."""
    # /usr/sbin is not on every PATH (non-login shells, CI runners).
    found = shutil.which("dovecot") or shutil.which("dovecot", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise MissingTestDependency(f"dovecot (IMAP server) is not installed: {INSTALL_HINT}")
    return found


@dataclass
class DovecotServer:
    """A running Dovecot with one mailbox user, plain IMAP on `host:port`.

    `stop()` and `start()` stop it and start it again on the same port and
    with the same mail (to test a provider's reconnection).
    """

    host: str
    port: int
    username: str
    password: str
    config_path: Path
    log_path: Path
    binary: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        """Start dovecot in the foreground (as our child) and wait for its port."""
        if self.process is not None and self.process.poll() is None:
            return
        # The child keeps its own copy of the log's descriptor; ours closes here.
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "-F", "-c", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        wait_for_port(self.host, self.port, process=self.process, log_path=self.log_path)

    def stop(self) -> None:
        """Stop dovecot; its port refuses connections afterwards."""
        stop_process(self.process)
        self.process = None

    def append(
        self, raw: bytes, internaldate: datetime | None = None, folder: str = "INBOX"
    ) -> int:
        """APPEND `raw` to `folder` with the given INTERNALDATE (default: now); return its UID."""
        return imap_append(self, raw, internaldate, folder)

    def uidvalidity(self, folder: str = "INBOX") -> int:
        """The folder's UIDVALIDITY, to predict provider message ids."""
        conn = imaplib.IMAP4(self.host, self.port, timeout=10)
        try:
            conn.login(self.username, self.password)
            conn.select(folder, readonly=True)
            _, data = conn.response("UIDVALIDITY")
            value = data[-1]
            assert isinstance(value, bytes)
            return int(value)
        finally:
            conn.logout()


def imap_append(
    server: DovecotServer,
    raw: bytes,
    internaldate: datetime | None = None,
    folder: str = "INBOX",
) -> int:
    """APPEND a raw RFC 5322 message with the given INTERNALDATE; return its UID."""
    when = internaldate or datetime.now(UTC)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    conn = imaplib.IMAP4(server.host, server.port, timeout=10)
    try:
        conn.login(server.username, server.password)
        typ, data = conn.append(folder, None, imaplib.Time2Internaldate(when), raw)
        if typ != "OK":
            raise RuntimeError(f"APPEND failed: {data!r}")
        # Dovecot answers "[APPENDUID <uidvalidity> <uid>] ..." (UIDPLUS).
        text = data[-1].decode() if isinstance(data[-1], bytes) else ""
        if "APPENDUID" not in text:
            raise RuntimeError(f"APPEND answer has no APPENDUID: {text!r}")
        return int(text.split("APPENDUID", 1)[1].split("]", 1)[0].split()[1])
    finally:
        conn.logout()


def _dovecot_users() -> tuple[str, str, str]:
    """(internal user, login user, mail user) for the config.

    Dovecot refuses to give mail access to root and to run its login
    processes as root, so as root it uses the system users that the Debian
    package creates. As another user everything runs as that user.
    """
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid()).pw_name
        return me, me, me
    for needed in ("dovecot", "dovenull"):
        try:
            pwd.getpwnam(needed)
        except KeyError:
            raise MissingTestDependency(
                f"system user {needed!r} is missing (dovecot-core creates it): {INSTALL_HINT}"
            ) from None
    return "dovecot", "dovenull", "dovecot"


@contextlib.contextmanager
def dovecot_server(
    tmp_path: Path, username: str = "qa@example.test", password: str = "s3cret-pass"
) -> Iterator[DovecotServer]:
    """Start a private Dovecot for one test, and stop it afterwards.

    Plain IMAP (no TLS) on a free 127.0.0.1 port, one user (`username`,
    `password`; the static passdb accepts only that password), maildir
    storage, logs in ``tmp_path/dovecot/dovecot.log``.
    """
    binary = find_dovecot()
    internal_user, login_user, mail_user = _dovecot_users()
    root = tmp_path / "dovecot"
    root.mkdir(parents=True, exist_ok=True)
    # The mail is read and written by `mail_user`, which cannot enter pytest's
    # 0700 tmp_path (owned by root), so it lives in its own directory in /tmp.
    mail_root = Path(tempfile.mkdtemp(prefix="signalbox-dovecot-mail-"))
    if os.geteuid() == 0:
        mail_pw = pwd.getpwnam(mail_user)
        os.chown(mail_root, mail_pw.pw_uid, mail_pw.pw_gid)
    # Dovecot's sockets live under base_dir, and a socket's path must fit in
    # 108 bytes: pytest's tmp_path (a worker's, a long test name) may not.
    run_dir = Path(tempfile.mkdtemp(prefix="sbdc-"))
    port = free_port()
    config_path = root / "dovecot.conf"
    log_path = root / "dovecot.log"
    config_path.write_text(
        f"""# Written by tests/servers/dovecot.py for one test run.
instance_name = signalbox-test-{port}
base_dir = {run_dir}
state_dir = {root}/state
listen = {LOOPBACK}
protocols = imap
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
# No 2 s penalty after a wrong password: tests check that on purpose.
auth_failure_delay = 0
# Stopping the server must cut open IMAP sessions (outage tests).
shutdown_clients = yes
log_path = {log_path}
info_log_path = {log_path}
mail_location = maildir:{mail_root}/%u
mail_uid = {mail_user}
mail_gid = {mail_user}
first_valid_uid = 1
default_internal_user = {internal_user}
default_internal_group = {internal_user}
default_login_user = {login_user}
passdb {{
  driver = static
  args = password={password}
}}
userdb {{
  driver = static
  args = home={mail_root}/home/%u
}}
service imap-login {{
  inet_listener imap {{
    address = {LOOPBACK}
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
"""
    )
    server = DovecotServer(
        host=LOOPBACK,
        port=port,
        username=username,
        password=password,
        config_path=config_path,
        log_path=log_path,
        binary=binary,
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(mail_root, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
