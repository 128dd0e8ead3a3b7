"""parse_mail: decoded headers and bodies, and never a crash on malformed input."""

from __future__ import annotations

import base64
from email.message import EmailMessage

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.mail import ParsedMail, html_events, parse_mail, strip_html

CRLF = b"\r\n"


def mime(*lines: bytes | str, body: bytes | str = b"") -> bytes:
    """Raw message bytes from header lines and a body, joined with CRLF as on the wire."""
    encoded = [line.encode() if isinstance(line, str) else line for line in lines]
    raw_body = body.encode() if isinstance(body, str) else body
    return CRLF.join(encoded) + CRLF + CRLF + raw_body


def assert_storable(mail: ParsedMail) -> None:
    """Every string must survive UTF-8 encoding and PostgreSQL text (no NUL)."""
    strings = [mail.subject, mail.text, mail.html, *mail.to, *mail.cc, *mail.defects]
    strings += [s for s in (mail.from_addr, mail.message_id_header, mail.run_marker) if s]
    for value in strings:
        value.encode("utf-8")
        assert "\x00" not in value


# --------------------------------------------------------------------------- headers


def test_subject_encoded_words_are_decoded_and_folding_collapsed() -> None:
    raw = mime(
        "Subject: =?utf-8?q?Caf=C3=A9?=",
        "  =?iso-8859-1?q?_cr=E8me?=  and\tmore",
        "To: a@example.com",
        body="x",
    )
    assert parse_mail(raw).subject == "Café crème and more"


def test_subject_is_nfc_normalised() -> None:
    # "e" + COMBINING ACUTE ACCENT must compare equal to the precomposed "é".
    raw = mime("Subject: =?utf-8?q?Cafe=CC=81?=", body="x")
    assert parse_mail(raw).subject == "Caf\u00e9"


def test_raw_utf8_subject_without_encoded_words_is_decoded() -> None:
    raw = mime(b"Subject: Bienvenue \xc3\xa0 bord", body=b"x")
    assert parse_mail(raw).subject == "Bienvenue à bord"


def test_missing_subject_is_empty_string() -> None:
    assert parse_mail(mime("To: a@example.com", body="x")).subject == ""


def test_to_and_cc_are_lower_cased_bare_addresses() -> None:
    raw = mime(
        'To: "Doe, Jane" <QA+Run1@Example.COM>, other@example.com',
        "Cc: Team: Lead <Lead@Example.com>, ops@example.com;",
        "From: Shop <NoReply@Shop.Example>",
        body="x",
    )
    mail = parse_mail(raw)
    assert mail.to == ("qa+run1@example.com", "other@example.com")
    assert mail.cc == ("lead@example.com", "ops@example.com")
    assert mail.from_addr == "noreply@shop.example"
    assert mail.recipients == ("qa+run1@example.com", "other@example.com", *mail.cc)


def test_encoded_display_name_with_comma_does_not_split_the_address() -> None:
    raw = mime("To: =?utf-8?q?Doe=2C_J=C3=BCrgen?= <j@example.com>", body="x")
    assert parse_mail(raw).to == ("j@example.com",)


def test_run_marker_prefers_x_signalbox_run_and_is_stripped() -> None:
    raw = mime("X-Run-Id: other", "X-Signalbox-Run:   run-42  ", body="x")
    assert parse_mail(raw).run_marker == "run-42"


def test_run_marker_falls_back_to_x_run_id() -> None:
    assert parse_mail(mime("X-Run-Id: run-7", body="x")).run_marker == "run-7"


def test_empty_run_marker_is_none() -> None:
    assert parse_mail(mime("X-Signalbox-Run:   ", body="x")).run_marker is None
    assert parse_mail(mime("To: a@example.com", body="x")).run_marker is None


def test_message_id_header_is_kept() -> None:
    raw = mime("Message-ID: <abc.123@mail.example>", body="x")
    assert parse_mail(raw).message_id_header == "<abc.123@mail.example>"


def test_header_the_modern_parser_chokes_on_is_read_raw_and_named_as_defect() -> None:
    # "<<<>>" makes email.policy.default raise IndexError on access.
    mail = parse_mail(mime("Message-ID: <<<>>", "Subject: still here", body="x"))
    assert mail.message_id_header == "<<<>>"
    assert mail.subject == "still here"
    assert "HeaderParseDefect:Message-ID" in mail.defects


def test_undecodable_header_bytes_become_valid_unicode() -> None:
    mail = parse_mail(mime(b"Subject: \xff\xfe odd", b"To: \xff@example.com", body=b"x"))
    assert_storable(mail)
    assert mail.subject.endswith("odd")


def test_very_long_to_header_is_read_without_the_quadratic_parser() -> None:
    others = ", ".join(f'"Person {i}" <p{i}@example.com>' for i in range(400))
    mail = parse_mail(mime(f"To: {others}, QA+Run1@Example.com", body="x"))
    assert mail.to[-1] == "qa+run1@example.com"
    assert len(mail.to) == 401
    assert "LongHeaderDefect:To" in mail.defects


def test_hostile_address_headers_finish_and_keep_the_body() -> None:
    # 100 KB of quotes takes the stdlib parser over a minute; nested comments
    # overflow its recursion. The test timeout is the guard.
    raw = mime(
        "To: " + '"' * 100_000,
        "Cc: " + "(" * 2000 + "cc@example.com",
        "From: " + "\\" * 50_000,
        body="still readable",
    )
    mail = parse_mail(raw)
    assert mail.text == "still readable"
    assert mail.to == ()
    assert mail.cc == ("cc@example.com",)


def test_content_type_that_overflows_the_modern_parser_falls_back_to_compat32() -> None:
    raw = mime("Subject: =?utf-8?q?Caf=C3=A9?=", "Content-Type: " + "(" * 3000, body="body text")
    mail = parse_mail(raw)
    assert (mail.subject, mail.text) == ("Café", "body text")
    assert "ModernParserDefect:RecursionError" in mail.defects


# --------------------------------------------------------------------------- bodies


def test_quoted_printable_soft_line_break_is_joined() -> None:
    raw = mime(
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: quoted-printable",
        body="Open https://app.example.com/verify?token=3Dabc=\r\ndef&x=3D1 now=\r\n.",
    )
    assert parse_mail(raw).text == "Open https://app.example.com/verify?token=abcdef&x=1 now."


def test_base64_text_part_is_decoded() -> None:
    payload = base64.b64encode("Grüße, dein Code ist 123456".encode()).decode()
    raw = mime(
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: base64",
        body=payload,
    )
    assert parse_mail(raw).text == "Grüße, dein Code ist 123456"


def test_iso_8859_1_charset_is_honoured() -> None:
    raw = mime(
        "Content-Type: text/plain; charset=ISO-8859-1",
        "Content-Transfer-Encoding: 8bit",
        body="Caf\xe9 cr\xe8me".encode("latin-1"),
    )
    assert parse_mail(raw).text == "Café crème"


def test_latin1_label_reads_windows_1252_quotes_like_browsers_do() -> None:
    raw = mime("Content-Type: text/plain; charset=iso-8859-1", body=b"\x93quoted\x94")
    assert parse_mail(raw).text == "\u201cquoted\u201d"


def test_unknown_charset_falls_back_to_utf8_and_is_named() -> None:
    raw = mime("Content-Type: text/plain; charset=x-no-such-charset", body="Café".encode())
    mail = parse_mail(raw)
    assert mail.text == "Café"
    assert "UnknownCharsetDefect" in mail.defects


def test_non_text_codec_named_as_charset_is_not_used() -> None:
    raw = mime("Content-Type: text/plain; charset=base64", body=b"aGVsbG8=")
    assert parse_mail(raw).text == "aGVsbG8="


def test_missing_charset_with_latin1_bytes_still_decodes() -> None:
    raw = mime("Content-Type: text/plain", body=b"Caf\xe9")
    assert parse_mail(raw).text == "Café"


def test_crlf_line_endings_become_newlines() -> None:
    raw = mime("Content-Type: text/plain", body=b"line one\r\nline two")
    assert parse_mail(raw).text == "line one\nline two"


def test_message_without_content_type_is_plain_text() -> None:
    mail = parse_mail(mime("Subject: hi", body="just text"))
    assert (mail.text, mail.html) == ("just text", "")


def test_html_only_message_has_html_and_no_text() -> None:
    mail = parse_mail(mime("Content-Type: text/html; charset=utf-8", body="<p>Hello</p>"))
    assert (mail.text, mail.html) == ("", "<p>Hello</p>")


def build_alternative() -> bytes:
    msg = EmailMessage()
    msg["To"] = "qa@example.com"
    msg["Subject"] = "Verify"
    msg.set_content("Plain body")
    msg.add_alternative("<p>HTML body</p>", subtype="html")
    msg.add_attachment(b"attached text", maintype="text", subtype="plain", filename="a.txt")
    return msg.as_bytes()


def test_multipart_alternative_yields_both_parts_and_skips_attachments() -> None:
    mail = parse_mail(build_alternative())
    assert mail.text.strip() == "Plain body"
    assert mail.html.strip() == "<p>HTML body</p>"
    assert mail.defects == ()


def test_attachment_before_the_body_is_not_taken_as_text() -> None:
    raw = mime(
        "Content-Type: multipart/mixed; boundary=XX",
        body=(
            "--XX\r\nContent-Type: text/plain\r\n"
            'Content-Disposition: attachment; filename="log.txt"\r\n\r\nlog line\r\n'
            "--XX\r\nContent-Type: text/plain\r\n\r\nthe real body\r\n--XX--\r\n"
        ),
    )
    assert parse_mail(raw).text == "the real body"


def test_forwarded_message_text_is_not_this_message_text() -> None:
    raw = mime(
        "Content-Type: multipart/mixed; boundary=XX",
        body=(
            "--XX\r\nContent-Type: message/rfc822\r\n\r\n"
            "Subject: old\r\nContent-Type: text/plain\r\n\r\nold body\r\n"
            "--XX--\r\n"
        ),
    )
    assert parse_mail(raw).text == ""


def test_bad_base64_is_decoded_as_far_as_possible_and_named() -> None:
    raw = mime(
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: base64",
        body="SGVsbG8gd29ybGQ=!!*",
    )
    mail = parse_mail(raw)
    assert mail.text.startswith("Hello world")
    assert "InvalidBase64CharactersDefect" in mail.defects


def test_truncated_multipart_keeps_the_parts_it_has() -> None:
    raw = mime(
        "Content-Type: multipart/alternative; boundary=XX",
        body="--XX\r\nContent-Type: text/plain\r\n\r\npartial body",
    )
    mail = parse_mail(raw)
    assert mail.text == "partial body"
    assert "CloseBoundaryNotFoundDefect" in mail.defects


def test_multipart_without_boundary_is_matched_on_its_raw_text() -> None:
    raw = mime("Content-Type: multipart/alternative", body="--x\r\n\r\nthe words\r\n")
    mail = parse_mail(raw)
    assert "the words" in mail.text
    assert "NoBoundaryInMultipartDefect" in mail.defects


def test_nul_bytes_are_removed_from_text() -> None:
    assert parse_mail(mime("Content-Type: text/plain", body=b"a\x00b")).text == "ab"


# --------------------------------------------------------------------------- matchable text


def test_matchable_text_prefers_the_text_part() -> None:
    mail = parse_mail(build_alternative())
    assert mail.matchable_text().strip() == "Plain body"


def test_matchable_text_falls_back_to_stripped_html_when_text_is_blank() -> None:
    mail = ParsedMail("", (), (), None, None, None, "  \n", "<p>A &amp; B</p>")
    assert mail.matchable_text() == "A & B"


def test_strip_html_drops_script_style_and_head() -> None:
    html = (
        "<html><head><title>T</title><style>p{color:red}</style></head>"
        "<body><script>var code='999999';</script><p>Visible</p></body></html>"
    )
    assert strip_html(html) == "Visible"


def test_strip_html_separates_blocks_but_not_inline_tags() -> None:
    html = "<table><tr><td>A</td><td>B</td></tr></table><p>bo<b>ld</b><br>next</p>"
    assert strip_html(html) == "A B bold next"


def test_strip_html_decodes_entities_and_normalises_whitespace() -> None:
    assert strip_html("<p>Tom&nbsp;&amp;\n\n  Jerry &lt;3 &#233;</p>") == "Tom & Jerry <3 é"


def test_strip_html_of_broken_markup_returns_text() -> None:
    assert "text" in strip_html("<p <<b>text</p><![if !x]>")


def test_strip_html_hides_comments_and_mixed_case_scripts() -> None:
    html = "<!-- secret 111111 --><SCRIPT type='x'>var a = 1;</script><p>shown</p>"
    assert strip_html(html) == "shown"


def test_unclosed_script_hides_the_rest_of_the_document() -> None:
    assert strip_html("<p>before</p><script>never shown <p>nor this</p>") == "before"


def test_quoted_greater_than_inside_an_attribute_does_not_end_the_tag() -> None:
    assert strip_html('<a title="a > b" href="https://x.example">link text</a>') == "link text"


def test_html_events_report_hrefs_in_document_order() -> None:
    html = (
        "<p>one</p><A HREF='https://a.example/?x=1&amp;y=2'>a</A>"
        '<a data-href="https://no.example" href = https://b.example/>b</a>'
    )
    hrefs = [value for kind, value in html_events(html) if kind == "href"]
    assert hrefs == ["https://a.example/?x=1&y=2", "https://b.example/"]


def test_strip_html_of_hostile_unclosed_tags_finishes() -> None:
    # html.parser needs minutes for this; the scanner is linear. The test timeout
    # is the guard, there is no timed assertion here.
    assert strip_html("<a " * 100_000 + "x") == ""
    assert strip_html("</" * 100_000) == "</" * 100_000


# --------------------------------------------------------------------------- never raises


@settings(max_examples=300)
@given(st.binary(max_size=2000))
def test_parse_mail_never_raises_on_random_bytes(raw: bytes) -> None:
    assert_storable(parse_mail(raw))


header_names = st.sampled_from(
    ["Subject", "To", "Cc", "From", "Message-ID", "X-Signalbox-Run", "X-Run-Id",
     "Content-Type", "Content-Transfer-Encoding", "Content-Disposition", "MIME-Version"]
)  # fmt: skip
header_values = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [
            b"multipart/alternative; boundary=b",
            b"multipart/mixed; boundary=",
            b"text/plain; charset=utf-7",
            b'text/html; charset="unknown-8bit"',
            b"text/plain; charset=idna",
            b"base64",
            b"quoted-printable",
            b"=?utf-8?b?!!!?=",
            b"=?bogus?q?=FF?=",
            b"<<<>>",
            b'a@b, <c@d>, "x,y" <e@f>;',
            b"attachment; filename=",
        ]
    ),
)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(header_names, header_values), max_size=10),
    st.lists(
        st.one_of(
            st.binary(max_size=200),
            st.sampled_from([b"--b\r\n", b"--b--\r\n", b"\r\n\r\n", b"=\r\n", b"=ZZ"]),
        ),
        max_size=10,
    ),
)
def test_parse_mail_never_raises_on_mime_shaped_garbage(
    headers: list[tuple[str, bytes]], body_chunks: list[bytes]
) -> None:
    raw = b"".join(name.encode() + b": " + value + CRLF for name, value in headers)
    raw += CRLF + b"".join(body_chunks)
    assert_storable(parse_mail(raw))
