"""The sink's TLS: its certificate and the server context STARTTLS and SMTPS share.

With `SIGNALBOX_SMTP_TLS_CERT` and `SIGNALBOX_SMTP_TLS_KEY` (PEM files) the
sink uses them. Without, it makes a self-signed certificate once, kept in the
data dir (`smtp-tls/cert.pem`, `smtp-tls/key.pem`; the key 0600, created
private) for `localhost`, `127.0.0.1` and `SIGNALBOX_SMTP_HOSTNAME`, and uses
it on every later start, so a test can trust it by path.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

from app.errors import ConfigurationError
from app.settings import Settings

log = logging.getLogger("signalbox.smtp")

SELF_SIGNED_DIR = "smtp-tls"
CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
# Long enough never to lapse under a test suite; a self-signed certificate is
# trusted by path or not verified at all, never by its dates alone.
VALID_DAYS = 3650


def sink_hostname(settings: Settings) -> str:
    """The name in the banner, EHLO and the self-signed certificate."""
    return settings.smtp_hostname.strip() or socket.getfqdn()


def tls_wanted(settings: Settings) -> bool:
    """Whether the sink needs a certificate (STARTTLS or SMTPS is on)."""
    return settings.smtp_tls != "off" or settings.smtps_port != 0


def cert_paths(settings: Settings) -> tuple[Path, Path]:
    """(certificate, key): the configured files, else the self-signed pair's,
    made now when it does not exist yet."""
    cert, key = settings.smtp_tls_cert.strip(), settings.smtp_tls_key.strip()
    if cert or key:
        if not (cert and key):
            raise ConfigurationError(
                "SIGNALBOX_SMTP_TLS_CERT and SIGNALBOX_SMTP_TLS_KEY are set together or not at all"
            )
        return Path(cert), Path(key)
    folder = Path(settings.data_dir) / SELF_SIGNED_DIR
    cert_path, key_path = folder / CERT_FILE, folder / KEY_FILE
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Sink processes starting together make one pair, not a key of one
    # and the certificate of another.
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not (cert_path.exists() and key_path.exists()):
            make_self_signed(folder, sink_hostname(settings))
    finally:
        os.close(fd)
    return cert_path, key_path


def server_context(settings: Settings) -> ssl.SSLContext:
    """The server context of STARTTLS and SMTPS; a file that cannot be read
    fails the start naming the setting."""
    cert, key = cert_paths(settings)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"the sink's TLS certificate {cert} or key {key} cannot be used ({exc}):"
            " check SIGNALBOX_SMTP_TLS_CERT and SIGNALBOX_SMTP_TLS_KEY"
        ) from None
    return context


def make_self_signed(folder: Path, hostname: str) -> None:
    """Write a self-signed certificate and its key into `folder` (0700), the
    key 0600 from creation, for localhost, 127.0.0.1 and `hostname`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    if hostname and hostname != "localhost":
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(hostname)))
        except ValueError:
            names.append(x509.DNSName(hostname))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Signalbox sink")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_private(folder / KEY_FILE, key_pem)
    _write_private(folder / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    log.info(
        "self-signed certificate made for the sink",
        extra={"event": "smtp_tls_self_signed", "path": str(folder / CERT_FILE)},
    )


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to a new file created with `mode` (never widened by a
    umask nor someone else's file), then move it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
