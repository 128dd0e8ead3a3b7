"""The sink skips parsing a message whose To and Cc plainly name only its
envelope recipients; anything else (another address, anything unusual) is
parsed, so no header recipient is ever missed."""

from __future__ import annotations

from email.message import EmailMessage

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.mail import header_recipients_within, parse_mail

ENVELOPE = ["user@example.test", "Team@Example.test"]


def raw(headers: str, body: str = "hello\r\n") -> bytes:
    return (headers.replace("\n", "\r\n") + "\r\n" + body).encode()


@pytest.mark.parametrize(
    "headers",
    [
        "To: user@example.test\nSubject: hi\n",
        'To: User <user@example.test>\nCc: "Team, all" <team@example.test>\n',
        "To: user@example.test,\n team@example.test\n",  # folded
        "Subject: no To at all\n",
        "TO: USER@EXAMPLE.TEST\n",
    ],
)
def test_plain_headers_naming_only_the_envelope_need_no_parse(headers: str) -> None:
    assert header_recipients_within(raw(headers), ENVELOPE)


@pytest.mark.parametrize(
    "headers",
    [
        "To: user@example.test\nCc: other@example.test\n",  # a recipient to add
        "To: =?utf-8?q?J=C3=B6rg?= <user@example.test>\n",  # encoded word
        "To: user@example.test (comment)\n",
        "To: undisclosed-recipients:;\n",  # a group
        'To: "quoted local"@example.test\n',
        "To: Jörg <user@example.test>\n",  # not ASCII
        "To: user@example.test <other@example.test>\n",
    ],
)
def test_anything_else_is_parsed(headers: str) -> None:
    assert not header_recipients_within(raw(headers), ENVELOPE)


addresses = st.from_regex(r"[a-z]{1,8}@[a-z]{1,6}\.test", fullmatch=True)


@given(st.lists(addresses, min_size=1, max_size=4), st.lists(addresses, max_size=3))
def test_a_skipped_parse_would_have_added_nothing(to: list[str], cc: list[str]) -> None:
    msg = EmailMessage()
    msg["To"] = ", ".join(to)
    if cc:
        msg["Cc"] = ", ".join(cc)
    msg["Subject"] = "x"
    msg.set_content("body")
    data = msg.as_bytes()
    envelope = to  # the Cc addresses may or may not be in it
    if header_recipients_within(data, envelope):
        parsed = parse_mail(data)
        assert set(parsed.to) | set(parsed.cc) <= {e.lower() for e in envelope}
    else:
        assert set(cc) - set(to)
