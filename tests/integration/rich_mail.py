"""A message with everything a test asserts on: multipart/alternative text and
HTML, an inline image, a PDF and a text file with a non-ASCII name. Built with
CRLF line endings so the bytes sent over SMTP are the bytes stored."""

from __future__ import annotations

import email.policy
import hashlib
import os
from dataclasses import dataclass, field
from email.message import EmailMessage

TEXT = "Hello Jürgen,\nyour code is 493817.\nPay at https://brand.test/pay?invoice=9\n"
HTML_TEMPLATE = (
    "<html><head><style>p {{ color: #0a5; }}</style></head><body>"
    '<h1 id="hello">Invoice ready</h1>'
    '<p>Hello J&uuml;rgen, <a href="https://brand.test/pay?invoice=9">Pay <b>now</b></a></p>'
    '<img id="logo" alt="logo" src="cid:logo@brand.test">'
    '<img id="remote" alt="tracker" src="{remote}">'
    "<script>document.title = 'SCRIPT RAN'; document.body.setAttribute('data-ran', '1');"
    " fetch('{remote}?from=script');</script>"
    "</body></html>"
)
PDF_NAME = "invoice-2026.pdf"
TXT_NAME = "Rechnung für Jürgen.txt"


@dataclass
class RichMail:
    raw: bytes
    html: str
    png: bytes
    pdf: bytes
    txt: bytes
    recipient: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    @staticmethod
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()


def rich_mail(
    recipient: str,
    *,
    remote: str = "http://127.0.0.1:9/pixel.png",
    pdf_bytes: int = 20_000,
    run: str | None = None,
    cc: str | None = "copy@example.test",
) -> RichMail:
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = '"Brand Bäckerei" <noreply@brand.test>'
    msg["To"] = f"User One <{recipient}>"
    if cc:
        msg["Cc"] = cc
    msg["Reply-To"] = "Support <support@brand.test>"
    msg["Subject"] = "Your invoice ✓ is ready"
    msg["Date"] = "Tue, 01 Dec 2026 10:00:00 +0100"
    msg["Message-ID"] = "<invoice-9@brand.test>"
    msg["List-Unsubscribe"] = "<https://brand.test/unsubscribe?u=1>"
    if run is not None:
        msg["X-Signalbox-Run"] = run
    msg.set_content(TEXT)
    html = HTML_TEMPLATE.format(remote=remote)
    msg.add_alternative(html, subtype="html")
    png = b"\x89PNG\r\n\x1a\n" + _png_body()
    msg.get_payload()[1].add_related(png, maintype="image", subtype="png", cid="<logo@brand.test>")
    pdf = b"%PDF-1.4\n" + os.urandom(pdf_bytes)
    msg.add_attachment(pdf, maintype="application", subtype="pdf", filename=PDF_NAME)
    txt = "Grüße aus Köln\r\n".encode()
    msg.add_attachment(txt, maintype="text", subtype="plain", filename=TXT_NAME)
    raw = msg.as_bytes()
    return RichMail(
        raw=raw,
        html=html,
        png=png,
        pdf=pdf,
        txt=txt,
        recipient=recipient,
        headers=[(k, str(v)) for k, v in msg.items()],
    )


def _png_body() -> bytes:
    """The rest of a real 1x1 red PNG (so the browser can draw it)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", 24, 24, 8, 2, 0, 0, 0)
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * 24 for _ in range(24))
    return chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
