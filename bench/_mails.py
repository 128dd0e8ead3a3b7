"""Typical mails, as applications send them, for the storage benchmark (and its test).

Each builder returns the bytes a client sends over SMTP (CRLF line ends) and
differs per call the way real mail does (a tracking token per link, a code,
a Message-ID), so nothing compresses better than the real thing would:

- `newsletter`: a ~20 KB HTML newsletter (multipart/alternative: a plain
  part and a table-laid-out HTML part with inline styles, images and
  tracked links), quoted-printable as most senders encode HTML;
- `newsletter_base64`: the same with the HTML part in base64, as some
  senders encode it (base64 hides the text's redundancy from TOAST);
- `verification`: a plain ~1 KB "verify your address" mail with a code and a link;
- `invoice_pdf`: a short plain mail with a small PDF attached (its content
  stream deflated, as PDF writers do), base64.
"""

from __future__ import annotations

import email.policy
import random
import uuid
import zlib
from collections.abc import Callable
from email.message import EmailMessage

_SENTENCES = (
    "Our spring collection has arrived, and the early reviews are in.",
    "Discover the pieces our team picked for the season ahead.",
    "Free shipping on every order over fifty euros until Sunday night.",
    "Members get early access to the sale and a gift with every purchase.",
    "We rebuilt the app from the ground up: faster search, saved lists, fewer taps.",
    "Read how a small workshop in Porto makes every bag by hand.",
    "Three recipes for a quick weeknight dinner, ready in twenty minutes.",
    "Your points balance is waiting: redeem them before the end of the month.",
    "Join us at the store on Saturday for a tasting and a live demo.",
    "The guide covers sizing, materials and how to care for linen.",
    "Thousands of readers told us what they wanted; here is what we changed.",
    "Not sure where to start? Take the two-minute quiz and get a suggestion.",
)


def _rng(seed: int | None) -> random.Random:
    return random.Random(seed if seed is not None else uuid.uuid4().int)


def _headers(msg: EmailMessage, to: str, subject: str, rng: random.Random) -> None:
    msg["From"] = "Shop Team <news@shop.example.test>"
    msg["To"] = to
    msg["Subject"] = subject
    msg["Message-ID"] = f"<{uuid.UUID(int=rng.getrandbits(128)).hex}@shop.example.test>"
    msg["List-Unsubscribe"] = (
        f"<https://shop.example.test/unsubscribe?u={rng.getrandbits(96):024x}>"
    )


def _link(rng: random.Random, path: str) -> str:
    return (
        f"https://click.shop.example.test/t/{rng.getrandbits(64):016x}?"
        f"url=https%3A%2F%2Fshop.example.test%2F{path}&utm_source=newsletter"
        f"&utm_medium=email&utm_campaign=spring-{rng.randint(1, 9)}"
    )


def _article(rng: random.Random, i: int) -> tuple[str, str]:
    title = " ".join(rng.choice(_SENTENCES).split()[: rng.randint(3, 6)]).rstrip(",:").title()
    text = " ".join(rng.sample(_SENTENCES, 3))
    href = _link(rng, f"collection/{i}")
    image = f"https://img.shop.example.test/{rng.getrandbits(48):012x}/hero-{i}.jpg"
    img_style = "display:block;border:0;border-radius:6px"
    h2_style = "margin:0 0 8px 0;font-size:20px;line-height:26px;color:#111111;font-weight:bold"
    button_style = (
        "display:inline-block;padding:10px 18px;background-color:#0a66c2;color:#ffffff;"
        "text-decoration:none;border-radius:4px;font-weight:bold"
    )
    html = (
        '<tr><td style="padding:24px 32px 8px 32px;font-family:Helvetica,Arial,sans-serif">\n'
        '<table role="presentation" width="100%" cellpadding="0" cellspacing="0" border="0">'
        '<tr>\n<td width="200" valign="top" style="padding-right:16px">'
        f'<a href="{href}" target="_blank">\n<img src="{image}" width="200" height="150"'
        f' alt="{title}" style="{img_style}"></a></td>\n'
        '<td valign="top" style="font-size:15px;line-height:22px;color:#333333">\n'
        f'<h2 style="{h2_style}">{title}</h2>\n<p style="margin:0 0 12px 0">{text}</p>\n'
        f'<a href="{href}" target="_blank" style="{button_style}">Shop now</a>\n'
        "</td></tr></table></td></tr>\n"
    )
    plain = f"{title}\n\n{text}\nShop now: {href}\n"
    return html, plain


def _newsletter(to: str, seed: int | None, cte: str) -> bytes:
    rng = _rng(seed)
    articles = [_article(rng, i) for i in range(9)]
    html = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>Spring news</title><style>@media only screen and (max-width:600px)"
        "{.container{width:100%!important}.stack{display:block!important;width:100%!important}}"
        "</style></head>\n"
        '<body style="margin:0;padding:0;background-color:#f4f4f4">\n'
        '<table role="presentation" class="container" width="600" align="center" cellpadding="0"'
        ' cellspacing="0" border="0" style="background-color:#ffffff;margin:0 auto">\n'
        '<tr><td style="padding:24px 32px;text-align:center"><img src="https://img.shop.example.test/'
        'logo.png" width="140" alt="Shop" style="border:0"></td></tr>\n'
        + "".join(h for h, _ in articles)
        + '<tr><td style="padding:32px;font-family:Helvetica,Arial,sans-serif;font-size:12px;'
        'line-height:18px;color:#888888;text-align:center">You receive this mail because you '
        "subscribed at shop.example.test. "
        f'<a href="{_link(rng, "preferences")}" style="color:#888888">Preferences</a> · '
        f'<a href="{_link(rng, "unsubscribe")}" style="color:#888888">Unsubscribe</a><br>'
        "Shop Example GmbH, Musterstraße 1, 10115 Berlin</td></tr>\n</table></body></html>\n"
    )
    plain = "\n".join(p for _, p in articles) + "\nUnsubscribe: " + _link(rng, "unsubscribe")
    msg = EmailMessage()
    _headers(msg, to, "Spring is here: new arrivals and 20% for members", rng)
    msg.set_content(plain, cte="quoted-printable")
    msg.add_alternative(html, subtype="html", cte=cte)
    return msg.as_bytes(policy=email.policy.SMTP)


def newsletter(to: str, seed: int | None = None) -> bytes:
    return _newsletter(to, seed, "quoted-printable")


def newsletter_base64(to: str, seed: int | None = None) -> bytes:
    return _newsletter(to, seed, "base64")


def verification(to: str, seed: int | None = None) -> bytes:
    rng = _rng(seed)
    msg = EmailMessage()
    _headers(msg, to, "Verify your email address", rng)
    code = f"{rng.randint(0, 999_999):06d}"
    link = f"https://app.example.test/verify?token={rng.getrandbits(128):032x}"
    msg.set_content(
        "Hello,\n\n"
        f"Your verification code is {code}. It expires in 15 minutes.\n\n"
        f"Or confirm your address with this link:\n{link}\n\n"
        "If you did not create an account, you can ignore this message; no account\n"
        "will be created without a confirmed address.\n\n"
        "Thanks,\nThe Example team\n"
    )
    return msg.as_bytes(policy=email.policy.SMTP)


def _pdf(rng: random.Random) -> bytes:
    """A one-page PDF of about 12 KB: a deflated text stream and a deflated
    (noisy, as photographs are) image, as PDF writers produce them."""
    lines = [
        f"BT /F1 10 Tf 50 {780 - 14 * i} Td ({rng.choice(_SENTENCES)} "
        f"Item {rng.randint(1000, 9999)} {rng.randint(1, 99)}.{rng.randint(0, 99):02d} EUR) Tj ET"
        for i in range(50)
    ]
    text = zlib.compress("\n".join(lines).encode())
    image = zlib.compress(bytes(rng.getrandbits(8) for _ in range(9000)))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> /XObject << /Im1 6 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(text) + text + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Type /XObject /Subtype /Image /Width 60 /Height 50 /ColorSpace /DeviceRGB"
        b" /BitsPerComponent 8 /Length %d /Filter /FlateDecode >>\nstream\n"
        % len(image)
        + image
        + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def invoice_pdf(to: str, seed: int | None = None) -> bytes:
    rng = _rng(seed)
    msg = EmailMessage()
    _headers(msg, to, f"Your invoice INV-{rng.randint(10000, 99999)}", rng)
    msg.set_content("Hello,\n\nplease find your invoice attached.\n\nThe Example team\n")
    msg.add_attachment(_pdf(rng), maintype="application", subtype="pdf", filename="invoice.pdf")
    return msg.as_bytes(policy=email.policy.SMTP)


# name → builder, in the order the benchmark reports them.
TYPICAL: dict[str, Callable[[str, int | None], bytes]] = {
    "html newsletter (QP)": newsletter,
    "html newsletter (base64)": newsletter_base64,
    "plain verification": verification,
    "small PDF attached": invoice_pdf,
}
