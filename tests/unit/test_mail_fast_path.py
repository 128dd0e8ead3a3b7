"""parse_mail's fast path for plain headers reads exactly what the modern parser reads.

Plain ASCII Subject and X- headers, and address lists of plain items, skip the
stdlib's header parser (a third of a parse's CPU). The claim is that nothing
observable changes: for any header values, the parse with the fast path and
the parse without it give the same ParsedMail, defects included. The values
are built from the tokens that matter at the grammar's edges (quotes,
brackets, dots, comments, encoded words, non-ASCII, folds).
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.domain.mail import parse_mail
from app.domain.mail.mime import MimeParser

TOKENS = [
    "a@example.com",
    "B.c@Example.Org",
    "x+y@sub.example.test",
    "a..b@example.com",
    ".a@example.com",
    "a@example..com",
    "a@-x.com",
    "a@[127.0.0.1]",
    "John",
    "John Q. Public",
    "O'Brien",
    '"Smith, John"',
    '"a\\"b"',
    '"unterminated',
    "<",
    ">",
    "<>",
    "@",
    ",",
    ", ",
    ";",
    ":",
    "group:",
    "(comment)",
    "(",
    ")",
    " ",
    "\t",
    "\r\n ",
    "=?utf-8?q?Caf=C3=A9?=",
    "=?",
    "café",
    "\x7f",
    "\x01",
    "x",
    ".",
    "-",
    "'",
]

values = st.lists(st.sampled_from(TOKENS), max_size=8).map("".join)


def _message(to: str, cc: str, sender: str, subject: str, marker: str) -> bytes:
    lines = [
        f"From: {sender}",
        f"To: {to}",
        f"Cc: {cc}",
        f"Subject: {subject}",
        f"X-Signalbox-Run: {marker}",
        "Content-Type: text/plain; charset=utf-8",
    ]
    return ("\r\n".join(lines) + "\r\n\r\nbody\r\n").encode("utf-8", "surrogateescape")


@settings(max_examples=600, deadline=None)
@given(to=values, cc=values, sender=values, subject=values, marker=values)
@example(
    to='"Smith, John" <a@example.com>, b@example.com',
    cc="Ann <c@example.com>",
    sender="<d@example.com>",
    subject="Verify  your\taddress",
    marker="run-1",
)
@example(to="John Q. Public <a@example.com>", cc="", sender="", subject="", marker="")
@example(to="a@example.com,", cc="a@example.com b@example.com", sender="x", subject="", marker="")
def test_the_fast_path_reads_what_the_modern_parser_reads(
    to: str, cc: str, sender: str, subject: str, marker: str
) -> None:
    raw = _message(to, cc, sender, subject, marker)
    assert MimeParser(raw).parse() == MimeParser(raw, plain_fast_path=False).parse()


def test_the_fast_path_keeps_repeated_and_folded_headers() -> None:
    raw = (
        b"To: a@example.com,\r\n b@example.com\r\n"
        b"To: c@example.com\r\n"
        b"Subject: one\r\n two\r\n"
        b"Subject: second\r\n\r\nbody"
    )
    mail = parse_mail(raw)
    assert mail.to == ("a@example.com", "b@example.com", "c@example.com")
    assert mail.subject == "one two"
    assert mail == MimeParser(raw, plain_fast_path=False).parse()
