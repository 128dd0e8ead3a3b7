"""A private Postfix (Debian's package) for one test: an MTA that accepts mail
on a free loopback port and relays all of it to one next hop, with mandatory
STARTTLS (`smtp_tls_security_level = encrypt`) and SASL credentials, as a
staging relay in front of the sink would. Its own configuration, queue and
log directories; its master runs in the foreground as our child."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.servers.base import (
    INSTALL_HINT,
    LOOPBACK,
    MissingTestDependency,
    free_port,
    stop_process,
    wait_for_port,
)

DEBIAN_MASTER_CF = Path("/etc/postfix/master.cf")


def find_postfix() -> str:
    found = shutil.which("postfix", path="/usr/sbin:/usr/local/sbin:/usr/bin")
    if found is None or not DEBIAN_MASTER_CF.exists():
        raise MissingTestDependency(f"postfix (an MTA) is not installed: {INSTALL_HINT}")
    return found


@dataclass
class PostfixServer:
    host: str
    port: int
    config_dir: Path
    log_path: Path


def _master_cf(port: int) -> str:
    """Debian's master.cf with its SMTP listener on loopback:`port` only and
    no service chrooted (the chroot would need a copy of /etc in the queue)."""
    lines = []
    for line in DEBIAN_MASTER_CF.read_text().splitlines():
        fields = line.split()
        if line[:1].isspace() or line.startswith("#") or len(fields) < 8:
            lines.append(line)
            continue
        if fields[1] == "inet":  # smtp, submission, smtps: ours alone
            if fields[0] != "smtp":
                continue
            fields[0] = f"{LOOPBACK}:{port}"
        fields[4] = "n"
        lines.append(" ".join(fields))
    if not any(line.startswith("postlog") for line in lines):
        lines.append("postlog unix-dgram n - n - 1 postlogd")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def postfix_relay(
    *, next_hop_port: int, username: str, password: str, ca_file: Path
) -> Iterator[PostfixServer]:
    """A Postfix on a free loopback port relaying everything to
    [127.0.0.1]:`next_hop_port` over mandatory STARTTLS with SASL
    (`username`, `password`), trusting `ca_file`; stopped and removed on exit.
    Its files live in a directory of its own under the system's temporary
    directory: its daemons run as the `postfix` user, who must reach them
    (a test's tmp_path is private to root)."""
    binary = find_postfix()
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="sbxpostfix-"))
    root.chmod(0o755)
    config, queue, data = root / "etc", root / "spool", root / "lib"
    for d in (config, queue, data):
        d.mkdir(parents=True, exist_ok=True)
    log_path = root / "maillog"
    secret = re.sub(r"[^A-Za-z0-9._-]", "", password)
    assert secret == password, "the password must be map-safe"
    (config / "main.cf").write_text(
        f"""compatibility_level = 3.6
queue_directory = {queue}
data_directory = {data}
mail_owner = postfix
setgid_group = postdrop
inet_interfaces = {LOOPBACK}
inet_protocols = ipv4
myhostname = relay.signalbox.test
mydestination =
mynetworks = 127.0.0.0/8
relayhost = [{LOOPBACK}]:{next_hop_port}
smtp_tls_security_level = encrypt
smtp_tls_CAfile = {ca_file}
smtp_tls_loglevel = 1
smtp_sasl_auth_enable = yes
smtp_sasl_password_maps = static:{username}:{password}
smtp_sasl_security_options = noanonymous
smtp_sasl_tls_security_options = noanonymous
maillog_file = {log_path}
maillog_file_prefixes = {root}
smtpd_banner = $myhostname ESMTP
biff = no
"""
    )
    (config / "main.cf").chmod(0o644)
    (config / "master.cf").write_text(_master_cf(port))
    subprocess.run([binary, "-c", str(config), "set-permissions"], check=False, capture_output=True)
    check = subprocess.run(
        [binary, "-c", str(config), "check"], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:  # it says why only to syslog or a terminal
        raise RuntimeError(f"postfix check failed for {config}: run it in a terminal to see why")
    with (root / "postfix.out").open("ab") as out:
        process = subprocess.Popen(
            [binary, "-c", str(config), "start-fg"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port(LOOPBACK, port, 30, process=process, log_path=log_path)
        yield PostfixServer(LOOPBACK, port, config, log_path)
    finally:
        subprocess.run(
            [binary, "-c", str(config), "stop"], check=False, capture_output=True, timeout=30
        )
        stop_process(process)
        shutil.rmtree(root, ignore_errors=True)
