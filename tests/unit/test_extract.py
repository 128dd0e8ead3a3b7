"""extract: the excerpt, links and one-time codes a claim hands the consumer."""

from __future__ import annotations

import base64
from email.message import EmailMessage

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.extract import EXCERPT_MAX_CHARS, extract, find_codes, find_links
from app.domain.mail import ParsedMail, parse_mail

CRLF = b"\r\n"


def mime(*lines: str, body: bytes | str = b"") -> bytes:
    raw_body = body.encode() if isinstance(body, str) else body
    return CRLF.join(line.encode() for line in lines) + CRLF + CRLF + raw_body


def text_mail(text: str = "", html: str = "") -> ParsedMail:
    return ParsedMail("s", ("a@example.com",), (), None, None, None, text, html)


# --------------------------------------------------------------------------- links


def test_verification_link_in_html_only_message_has_entities_decoded() -> None:
    raw = mime(
        "To: qa@example.com",
        "Content-Type: text/html; charset=utf-8",
        body=(
            '<p>Hi!</p><p><a href="https://app.example.com/verify?token=abc&amp;uid=42">'
            "Verify</a></p>"
        ),
    )
    assert extract(parse_mail(raw)).links == ("https://app.example.com/verify?token=abc&uid=42",)


def test_quoted_printable_soft_break_inside_url_yields_the_whole_url() -> None:
    raw = mime(
        "Content-Type: text/plain; charset=utf-8",
        "Content-Transfer-Encoding: quoted-printable",
        body="Verify: https://app.example.com/verify?token=3Dabcdef0123=\r\n456789&uid=3D7\r\n",
    )
    links = extract(parse_mail(raw)).links
    assert links == ("https://app.example.com/verify?token=abcdef0123456789&uid=7",)


def test_links_come_in_document_order_text_then_html_without_repeats() -> None:
    mail = text_mail(
        text="First https://a.example/1 then https://b.example/2",
        html=(
            '<a href="https://b.example/2">again</a> <a href="https://c.example/3">c</a> '
            "bare https://d.example/4?x=1&amp;y=2"
        ),
    )
    assert extract(mail).links == (
        "https://a.example/1",
        "https://b.example/2",
        "https://c.example/3",
        "https://d.example/4?x=1&y=2",
    )


def test_trailing_punctuation_is_not_part_of_a_bare_url() -> None:
    text = "See https://a.example/x. Or (https://b.example/y), <https://c.example/z>; done"
    assert find_links(text) == ("https://a.example/x", "https://b.example/y", "https://c.example/z")


def test_balanced_parentheses_stay_in_the_url() -> None:
    text = "Read https://en.wikipedia.org/wiki/Mail_(disambiguation)."
    assert find_links(text) == ("https://en.wikipedia.org/wiki/Mail_(disambiguation)",)


def test_only_http_and_https_links_are_kept() -> None:
    mail = text_mail(
        html=(
            '<a href="mailto:help@example.com">mail</a><a href="javascript:go()">js</a>'
            '<a href="ftp://f.example/x">ftp</a><a href=" HTTPS://ok.example/a ">ok</a>'
            '<img src="https://track.example/pixel.gif">'
        )
    )
    assert extract(mail).links == ("HTTPS://ok.example/a",)


def test_urls_in_scripts_and_styles_are_not_links() -> None:
    mail = text_mail(
        html="<style>@import url(https://css.example/a.css);</style>"
        "<script>fetch('https://js.example/x')</script><p>https://seen.example/p</p>"
    )
    assert extract(mail).links == ("https://seen.example/p",)


# --------------------------------------------------------------------------- codes


def test_six_digit_code_is_found() -> None:
    assert extract(text_mail("Your verification code is 482913.")).codes == ("482913",)


def test_upper_case_alphanumeric_code_with_a_digit_is_found() -> None:
    assert find_codes("Use K7F2QX to sign in, or CODE, or abc123") == ("K7F2QX",)


def test_code_length_is_between_4_and_10() -> None:
    assert find_codes("123 1234 1234567890 12345678901") == ("1234", "1234567890")


def test_codes_are_deduplicated_in_order() -> None:
    assert find_codes("Code 654321. Again: 654321. Backup 111222") == ("654321", "111222")


def test_numbers_inside_urls_and_addresses_are_not_codes() -> None:
    text = "Open https://x.example/verify/938271?ref=55555 or write to user12345@x.example"
    assert find_codes(text) == ()


def test_dates_times_and_years_are_not_codes() -> None:
    text = (
        "Sent on May 5, 2026 at 12:30. Valid until 2026-05-06 10:30:00, "
        "or 06/05/2026. © 2026 Shop Inc."
    )
    assert find_codes(text) == ()


def test_a_bare_four_digit_number_that_looks_like_a_year_is_still_a_code() -> None:
    assert find_codes("Your PIN is 2026") == ("2026",)


def test_hex_colours_are_not_codes() -> None:
    assert find_codes("Brand colour #A1B2C3 and #112233") == ()


def test_phone_numbers_and_amounts_are_not_codes() -> None:
    assert find_codes("Call 555-0123-4567 or pay $1,234.5678 now") == ()


def test_codes_are_read_from_stripped_html_when_there_is_no_text() -> None:
    mail = text_mail(html='<p style="color:#FF0000">Code: <b>730155</b></p>')
    assert extract(mail).codes == ("730155",)


# --------------------------------------------------------------------------- excerpt


def test_excerpt_is_whitespace_normalised_text() -> None:
    mail = text_mail("Hello,\r\n\r\n   here is\tyour code.")
    assert extract(mail).body_excerpt == "Hello, here is your code."


def test_excerpt_never_exceeds_500_characters() -> None:
    assert len(extract(text_mail("word " * 400)).body_excerpt) <= EXCERPT_MAX_CHARS
    assert len(extract(text_mail("x" * 1000)).body_excerpt) == EXCERPT_MAX_CHARS


# --------------------------------------------------------------------------- MIME shapes


def test_iso_8859_1_message_is_decoded_before_extraction() -> None:
    raw = mime(
        "Content-Type: text/plain; charset=iso-8859-1",
        "Content-Transfer-Encoding: quoted-printable",
        body="R=E9initialisez: https://x.example/r?n=3Dz=E9ro code 918273",
    )
    result = extract(parse_mail(raw))
    assert result.body_excerpt.startswith("Réinitialisez")
    assert result.links == ("https://x.example/r?n=zéro",)
    assert result.codes == ("918273",)


def test_base64_parts_are_decoded_before_extraction() -> None:
    text = base64.b64encode(b"Code 246810").decode()
    html = base64.b64encode(b'<a href="https://x.example/b64?a=1&amp;b=2">go</a>').decode()
    b64 = "Content-Transfer-Encoding: base64\r\n\r\n"
    raw = mime(
        "Content-Type: multipart/alternative; boundary=BB",
        body=(
            f"--BB\r\nContent-Type: text/plain\r\n{b64}{text}\r\n"
            f"--BB\r\nContent-Type: text/html\r\n{b64}{html}\r\n"
            "--BB--\r\n"
        ),
    )
    result = extract(parse_mail(raw))
    assert result.codes == ("246810",)
    assert result.links == ("https://x.example/b64?a=1&b=2",)


def test_multipart_alternative_takes_excerpt_from_text_and_links_from_both() -> None:
    msg = EmailMessage()
    msg["To"] = "qa@example.com"
    msg.set_content("Confirm at https://x.example/text-link\nCode: 135790\n")
    msg.add_alternative(
        '<p>Confirm <a href="https://x.example/html-link?a=1&amp;b=2">here</a></p>',
        subtype="html",
    )
    result = extract(parse_mail(msg.as_bytes()))
    assert result.body_excerpt == "Confirm at https://x.example/text-link Code: 135790"
    assert result.links == ("https://x.example/text-link", "https://x.example/html-link?a=1&b=2")
    assert result.codes == ("135790",)


# --------------------------------------------------------------------------- never raises


@settings(max_examples=300)
@given(st.binary(max_size=3000))
def test_parse_and_extract_never_raise_on_random_bytes(raw: bytes) -> None:
    result = extract(parse_mail(raw))
    assert len(result.body_excerpt) <= EXCERPT_MAX_CHARS
    assert all(link.lower().startswith(("http://", "https://")) for link in result.links)
    assert all(4 <= len(code) <= 10 for code in result.codes)


@settings(max_examples=300)
@given(st.text(max_size=1000), st.text(max_size=1000))
def test_extract_never_raises_on_arbitrary_text_and_html(text: str, html: str) -> None:
    result = extract(text_mail(text, html))
    assert len(result.body_excerpt) <= EXCERPT_MAX_CHARS
    assert len(set(result.links)) == len(result.links)
    assert len(set(result.codes)) == len(result.codes)
