"""Keys kept in the data directory, and the deployment's recipient-hash key.

A key that is not set (SIGNALBOX_RECIPIENT_HASH_KEY, SIGNALBOX_CONSOLE_SECRET)
is a random one created once in SIGNALBOX_DATA_DIR (mode 0600 from its
creation, linked into place complete) and read by every later process.
Every process of one deployment must hash with the same key (the
sink logs a hash the API's evidence must match), so processes on several
hosts or pods must set the setting: each data directory would otherwise
make its own key.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from pathlib import Path

from app.domain import ids
from app.errors import ConfigurationError
from app.settings import Settings, get_settings

KEY_FILE = "recipient-hash-key"
MIN_KEY_CHARS = 16

_lock = threading.Lock()
_keys: dict[str, bytes] = {}


def recipient_hash_key(settings: Settings | None = None) -> bytes:
    """The key: the setting, else the one kept in the data directory (created
    on first use). ConfigurationError when the kept key cannot be read or made."""
    settings = settings or get_settings()
    if settings.recipient_hash_key:
        return settings.recipient_hash_key.encode()
    return kept_key(settings, KEY_FILE, "SIGNALBOX_RECIPIENT_HASH_KEY")


def kept_key(settings: Settings, file_name: str, setting: str) -> bytes:
    """The key kept in `file_name` of the data directory, created on first
    use; ConfigurationError (naming `setting`, which replaces it) when it
    cannot be read or made, or is truncated."""
    path = Path(settings.data_dir).absolute() / file_name
    with _lock:
        key = _keys.get(str(path))
        if key is None:
            key = _load_or_create(path, setting)
            _keys[str(path)] = key
        return key


def recipient_hash(address: str, settings: Settings | None = None) -> str:
    """The recipient hash of ``address`` with this deployment's key."""
    return ids.recipient_hash(address, recipient_hash_key(settings))


def _load_or_create(path: Path, setting: str) -> bytes:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            _create(path)
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"the kept key {path} cannot be read or created ({type(exc).__name__}): set {setting}"
        ) from None
    if len(key) < MIN_KEY_CHARS:
        raise ConfigurationError(
            f"the kept key {path} is shorter than {MIN_KEY_CHARS} characters: set {setting}"
        )
    return key


def _create(path: Path) -> None:
    """Write a fresh key beside ``path`` and link it into place: processes
    starting together all end up reading the one complete file that won."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_hex(32).encode())
            handle.flush()
            os.fsync(handle.fileno())
        # Fails if another process linked its key first: that key is the one.
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)
