"""The decoded view of one email, and the names of the bounds it hit."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.mail.html import strip_html

BOUND_DEFECT_PREFIX = "BoundExceeded:"


@dataclass(frozen=True)
class ParsedMail:
    """The decoded view of one email.

    ``subject`` has RFC 2047 encoded words decoded, whitespace collapsed and is
    NFC-normalised (``''`` when absent). ``to``, ``cc`` and ``from_addr`` hold
    lower-cased bare addresses (``a@example.com``, no display name).
    ``run_marker`` is ``X-Signalbox-Run``, else ``X-Run-Id``, stripped, or None.
    ``text`` and ``html`` are the first text/plain and text/html
    parts that are not attachments, decoded with their charset and with line
    endings normalised to ``\\n``; each is ``''`` when the message has none.
    ``defects`` names what was malformed (e.g. ``InvalidBase64CharactersDefect``,
    ``UnknownCharsetDefect``); it is empty for a clean message.
    """

    subject: str
    to: tuple[str, ...]
    cc: tuple[str, ...]
    from_addr: str | None
    message_id_header: str | None
    run_marker: str | None
    text: str
    html: str
    defects: tuple[str, ...] = ()

    def matchable_text(self) -> str:
        """The text ``body_contains`` and extraction look at.

        The text/plain part as decoded when it has any non-blank content,
        else the HTML part through :func:`strip_html` (tags removed, entities
        decoded, script/style dropped, whitespace collapsed).
        """
        if self.text.strip():
            return self.text
        return strip_html(self.html)

    @property
    def recipients(self) -> tuple[str, ...]:
        """To then Cc addresses, without repeats."""
        return tuple(dict.fromkeys(self.to + self.cc))


def bounds_exceeded(mail: ParsedMail) -> tuple[str, ...]:
    """The names of the bounds this message hit (``parts``, ``time``, ...)."""
    return tuple(
        d[len(BOUND_DEFECT_PREFIX) :] for d in mail.defects if d.startswith(BOUND_DEFECT_PREFIX)
    )
