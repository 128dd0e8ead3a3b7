"""Bytes and raw header values into clean text.

Every string these functions return is valid Unicode (no lone surrogates)
and holds no NUL character.
"""

from __future__ import annotations

import codecs
import email.header
import re

_SURROGATE_RUN = re.compile("[\udc80-\udcff]+")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Make a string safe to store: recover raw 8-bit bytes, drop NULs and lone surrogates.

    The email package smuggles undecodable header/body bytes through as
    surrogate escapes; those are decoded here as UTF-8, else Windows-1252.
    """
    if _LONE_SURROGATE.search(text):
        text = _SURROGATE_RUN.sub(_decode_escaped_run, text)
        text = _LONE_SURROGATE.sub("\ufffd", text)
    return text.replace("\x00", "")


def _decode_escaped_run(match: re.Match[str]) -> str:
    data = match.group().encode("utf-8", "surrogateescape")
    return decode_bytes(data, None, [])


def decode_bytes(data: bytes, charset: str | None, notes: list[str]) -> str:
    """Decode body bytes, honouring ``charset`` when it is a real text encoding.

    ``us-ascii`` labels are read as UTF-8 (a superset, and mislabelled UTF-8 is
    common); ``iso-8859-1`` as Windows-1252 first, as browsers do, because
    senders routinely put curly quotes (0x80-0x9f) in "latin-1" text.
    """
    codec: str | None = None
    if charset:
        try:
            codec = codecs.lookup(charset.strip().strip("\"'")).name
        except (LookupError, ValueError):
            notes.append("UnknownCharsetDefect")
    if codec == "ascii":
        codec = "utf-8"
    attempts: list[str] = []
    if codec == "latin-1" or codec == "iso8859-1":
        attempts = ["cp1252", "latin-1"]
    elif codec:
        attempts = [codec]
    for attempt in attempts:
        try:
            return data.decode(attempt)
        except Exception:
            continue
    if codec:
        try:
            decoded = data.decode(codec, "replace")
            notes.append("CharsetMismatchDefect")
            return decoded
        except Exception:  # not a text codec ("base64", "rot13", ...)
            notes.append("UnknownCharsetDefect")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def decode_raw_header(value: str) -> str:
    """Decode a raw header value by hand: 8-bit bytes, then RFC 2047 encoded words."""
    value = clean_text(value)
    try:
        parts = email.header.decode_header(value)
    except Exception:
        return value
    out: list[str] = []
    for chunk, charset in parts:
        if isinstance(chunk, str):
            out.append(chunk)
        else:
            out.append(decode_bytes(chunk, charset, []))
    return "".join(out)


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace (including NBSP and line breaks) to one space."""
    return " ".join(text.split())
