"""The whole message, pure: the linear MIME scan agrees with the stdlib on
well-formed mail, decodes attachments chunk by chunk exactly, and stays
bounded on hostile structure (never raising, never slow)."""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import hashlib
import quopri
from email.message import EmailMessage

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.domain.extract import extract
from app.domain.mail import parse_mail
from app.domain.mail import structure as structure_mod
from app.domain.mail.html import html_anchors
from app.domain.mail.structure import MAX_PARTS, Part, decoded_chunks, scan
from app.domain.whole_message import (
    attachment_id,
    claim_content,
    digest,
    find_attachment,
    read_message,
)


def _part(encoding: str, start: int, end: int) -> Part:
    return Part("1", (), (), "application/octet-stream", None, None, None, None,
                encoding, start, end, 0, True)  # fmt: skip


@given(st.binary(max_size=5000), st.integers(min_value=4, max_value=300))
@settings(max_examples=60)
def test_base64_decoded_in_chunks_equals_the_whole(data: bytes, chunk: int) -> None:
    encoded = base64.encodebytes(data)
    original = structure_mod.CHUNK_BYTES
    structure_mod.CHUNK_BYTES = chunk
    try:
        got = b"".join(decoded_chunks(encoded, _part("base64", 0, len(encoded))))
    finally:
        structure_mod.CHUNK_BYTES = original
    assert got == data


@given(st.binary(max_size=3000), st.integers(min_value=80, max_value=400))
@settings(max_examples=60)
def test_quoted_printable_decoded_in_chunks_equals_the_whole(data: bytes, chunk: int) -> None:
    encoded = quopri.encodestring(data).replace(b"\n", b"\r\n")
    original = structure_mod.CHUNK_BYTES
    structure_mod.CHUNK_BYTES = chunk
    try:
        got = b"".join(decoded_chunks(encoded, _part("quoted-printable", 0, len(encoded))))
    finally:
        structure_mod.CHUNK_BYTES = original
    assert got == binascii.a2b_qp(encoded)


@given(st.binary(max_size=400))
def test_bogus_base64_never_raises(junk: bytes) -> None:
    b"".join(decoded_chunks(junk, _part("base64", 0, len(junk))))


def _mail(files: list[tuple[str, bytes]], html: bool = True) -> bytes:
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = "a@example.test"
    msg["To"] = "b@example.test"
    msg["Subject"] = "files"
    msg.set_content("text body\n")
    if html:
        msg.add_alternative("<p>html body</p>", subtype="html")
    for name, data in files:
        msg.add_attachment(data, maintype="application", subtype="octet-stream", filename=name)
    return msg.as_bytes()


names = st.text(st.characters(blacklist_categories=["Cs", "Cc"]), min_size=1, max_size=30)


@given(st.lists(st.tuples(names, st.binary(max_size=2000)), max_size=5), st.booleans())
@example(files=[(" ", b"")], html=False)  # found by hypothesis: a blank name
@settings(max_examples=40)
def test_attachments_and_bodies_agree_with_the_stdlib(
    files: list[tuple[str, bytes]], html: bool
) -> None:
    raw = _mail(files, html)
    whole = read_message(raw, "msg_1")
    reference = email.message_from_bytes(raw, policy=email.policy.default)
    # A blank filename (the stdlib's "") is no filename: None, as for none given.
    expected = [(p.get_filename() or None, p.get_content()) for p in reference.iter_attachments()]
    assert [(a.filename, a.size, a.sha256) for a in whole.attachments] == [
        (n, len(d), hashlib.sha256(d).hexdigest()) for n, d in expected
    ]
    parsed = parse_mail(raw)
    assert (whole.text, whole.html) == (parsed.text, parsed.html)
    assert claim_content(raw) == extract(parsed)
    for att in whole.attachments:
        found = find_attachment(raw, "msg_1", att.attachment_id)
        assert found is not None and found.sha256 == att.sha256


CLAIM_SAMPLES = {
    "html only, quoted-printable": (
        b"Subject: =?utf-8?q?Code_=E2=9C=93?=\r\nContent-Type: text/html; charset=utf-8\r\n"
        b"Content-Transfer-Encoding: quoted-printable\r\n\r\n"
        b'<p>Your code is <b>493817</b>. <a href=3D"https://x.test/v?t=3D1">Verify</a></p>\r\n'
    ),
    "latin-1 text": (
        b"Content-Type: text/plain; charset=iso-8859-1\r\n\r\nCaf\xe9 code 739204 "
        b"\x93quoted\x94 https://x.test/a.\r\n"
    ),
    "no charset, 8-bit": b"Subject: x\r\n\r\nGr\xc3\xbc\xc3\x9fe 4821 https://y.test/\r\n",
    "alternative with attachment text": (
        b"Content-Type: multipart/mixed; boundary=m\r\n\r\n--m\r\n"
        b"Content-Type: text/plain\r\nContent-Disposition: attachment; filename=a.txt\r\n\r\n"
        b"not this 111111\r\n--m\r\nContent-Type: text/plain\r\n\r\nbut this 222222\r\n--m--\r\n"
    ),
    "bogus charset": b"Content-Type: text/plain; charset=x-bogus\r\n\r\ncode 5309 \xff\r\n",
}


@pytest.mark.parametrize("name", sorted(CLAIM_SAMPLES))
def test_the_claims_content_equals_the_matching_parse(name: str) -> None:
    raw = CLAIM_SAMPLES[name]
    assert claim_content(raw) == extract(parse_mail(raw))


def test_attachment_ids_are_stable_and_opaque() -> None:
    raw = _mail([("a.bin", b"1"), ("b.bin", b"2")])
    first = [a.attachment_id for a in read_message(raw, "msg_1").attachments]
    assert first == [a.attachment_id for a in read_message(raw, "msg_1").attachments]
    assert first != [a.attachment_id for a in read_message(raw, "msg_2").attachments]
    assert all(len(i) == 28 and i.startswith("att_") for i in first)
    assert attachment_id("msg_1", "2") == first[0]
    assert find_attachment(raw, "msg_1", "att_" + "0" * 24) is None


def test_digest_pins_hashes_and_carries_no_content() -> None:
    raw = _mail([("secret-493817.pdf", b"%PDF secret body")])
    pinned = digest(raw, "msg_1")
    assert pinned["message_sha256"] == hashlib.sha256(raw).hexdigest()
    assert pinned["attachments"] == [
        {"filename": "secret-493817.pdf", "content_type": "application/octet-stream",
         "size": 16, "sha256": hashlib.sha256(b"%PDF secret body").hexdigest()}
    ]  # fmt: skip
    assert "secret body" not in repr(pinned)


def test_anchor_text_follows_the_link() -> None:
    html = '<a href="https://x.test/a">Pay <b>now</b></a> <a href=https://y.test>Y<a href="z">'
    assert html_anchors(html) == [("https://x.test/a", "Pay now"), ("https://y.test", "Y"),
                                  ("z", "")]  # fmt: skip


HOSTILE = {
    "flat parts": b"Content-Type: multipart/mixed; boundary=b\r\n\r\n"
    + b"".join(
        b"--b\r\nContent-Type: application/x; name=p%d\r\n\r\nx\r\n" % i for i in range(20000)
    )
    + b"--b--\r\n",
    "deep nesting": b"Content-Type: multipart/mixed; boundary=b0\r\n\r\n"
    + b"".join(
        b"--b%d\r\nContent-Type: multipart/mixed; boundary=b%d\r\n\r\n" % (i, i + 1)
        for i in range(3000)
    ),
    "huge header": b"Subject: " + b"x" * 3_000_000 + b"\r\n\r\nbody",
    "many headers": b"".join(b"X-H%d: v\r\n" % i for i in range(100_000)) + b"\r\nbody",
    "folded to": b"To: " + b"\r\n ".join([b'"a'] * 100_000) + b"\r\n\r\nbody",
    "param storm": b"Content-Type: multipart/mixed;" + b";" * 100_000 + b"boundary=x\r\n\r\n--x--",
    "bogus base64": b"Content-Type: application/pdf\r\nContent-Transfer-Encoding: base64\r\n\r\n"
    + b"!!**==QUJD\r\n" * 50_000,
    "no blank line": b"Content-Type: multipart/mixed; boundary=b\r\n" + b"--b\r\n" * 5000,
    "binary junk": bytes(range(256)) * 4000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_structure_is_bounded(name: str) -> None:
    raw = HOSTILE[name]
    whole = read_message(raw, "msg_h")  # bounded in time by the suite's per-test timeout
    assert len(scan(raw).parts) <= MAX_PARTS
    assert len(whole.attachments) < MAX_PARTS
    assert len(whole.headers) <= 1004
    assert all(len(v) <= 16 * 1024 for _, v in whole.headers)
    assert whole.size == len(raw)
