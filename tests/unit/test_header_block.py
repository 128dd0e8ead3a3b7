"""The sink's way under load: To and Cc read from the header block alone."""

from __future__ import annotations

from app.domain.mail import header_block, header_block_recipients
from app.domain.mail.bounds import MAX_HEADER_BYTES


def test_to_and_cc_are_read_from_the_header_block_folded_encoded_or_not() -> None:
    raw = (
        b'From: app@example.test\r\nTo: a@example.test,\r\n  "B" <B@Example.test>\r\n'
        b"Cc: =?utf-8?q?J=C3=BCrgen?= <c@example.test>\r\nSubject: x\r\n\r\n"
        b"To: body@example.test\r\n"
    )
    assert header_block_recipients(header_block(raw)) == [
        "a@example.test",
        "b@example.test",
        "c@example.test",
    ]


def test_the_header_block_is_bounded_and_a_copy() -> None:
    raw = b"To: a@example.test\r\nX-Fill: " + b"f" * (2 * MAX_HEADER_BYTES)
    head = header_block(memoryview(raw).tobytes())
    assert len(head) == MAX_HEADER_BYTES
    assert header_block_recipients(head) == ["a@example.test"]
    assert header_block_recipients(b"Subject: no recipients") == []
