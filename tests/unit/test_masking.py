"""mask_subject: no one-time code, link token or address survives; the words do."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.domain.masking import mask_subject

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def test_login_code_in_a_subject_is_masked() -> None:
    assert mask_subject("Your login code is 739204") == "Your login code is <code>"


def test_mixed_letter_and_digit_codes_are_masked() -> None:
    assert mask_subject("Code AB12CD inside") == "Code <code> inside"
    assert mask_subject("token 3f9a8b7c6d5e4f3a2b1c0d") == "token <code>"


def test_digit_groups_joined_into_a_code_are_masked() -> None:
    assert mask_subject("Code: 739-204 now") == "Code: <code> now"
    assert mask_subject("Code: 739 204") == "Code: <code>"
    assert mask_subject("Code: 73.92.04") == "Code: <code>"


def test_full_width_digits_are_a_code_too() -> None:
    assert mask_subject("Code \uff17\uff13\uff19\uff12\uff10\uff14") == "Code <code>"


def test_links_become_link_whatever_their_scheme() -> None:
    assert mask_subject("Reset: https://app.example/r/4f9a?t=x now") == "Reset: <link> now"
    assert mask_subject("see www.example.com/verify/abc") == "see <link>"
    assert mask_subject("open myapp://verify/abcdef") == "open <link>"


def test_addresses_are_masked() -> None:
    assert mask_subject("Welcome qa+run1@example.com!") == "Welcome <address>"


def test_words_and_short_numbers_are_kept() -> None:
    assert mask_subject("Welcome aboard") == "Welcome aboard"
    assert mask_subject("Step 2 of 3: release v1.2") == "Step 2 of 3: release v1.2"


def test_control_characters_become_spaces() -> None:
    assert mask_subject("a\x1bred\x00b\x7f") == "a red b "


def test_empty_subject_stays_empty() -> None:
    assert mask_subject("") == ""


def test_a_huge_subject_is_masked_in_linear_time() -> None:
    subject = " ".join(["x1" * 200_000, "a-" * 100_000, "https://" * 50_000, "a@" * 50_000])
    masked = mask_subject(subject)
    assert "x1x1" not in masked


codes = st.text(ALNUM, min_size=4, max_size=10).filter(lambda t: any(c.isdigit() for c in t))
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=300)
@given(words, codes, words)
def test_a_code_anywhere_in_a_subject_never_survives(before: str, code: str, after: str) -> None:
    assert code not in mask_subject(before + code + after)


@settings(max_examples=300)
@given(
    words,
    st.sampled_from(["https", "http", "ftp", "myapp"]),
    st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=12),
    st.text(ALNUM + "-_", min_size=1, max_size=30),
    words,
)
def test_a_url_path_token_never_survives(
    before: str, scheme: str, host: str, token: str, after: str
) -> None:
    # A token that is part of the masks themselves ("o" in "<code>") proves nothing.
    assume(token not in before + after + host + scheme + "<link><code><address>")
    subject = f"{before} {scheme}://{host}.example/reset/{token}?t={token} {after}"
    assert token not in mask_subject(subject)


@given(words)
def test_masking_is_idempotent(subject: str) -> None:
    once = mask_subject(subject)
    assert mask_subject(once) == once
