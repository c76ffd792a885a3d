"""The fake Telegram's parse rules (tests/telegram_fake.py), which the real-hermes group
relies on: a fake that accepted what Telegram refuses would hide hermes' fallbacks."""

from __future__ import annotations

import pytest

from tests.telegram_fake import ParseError, parse_html, parse_markdown_v2, render


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("<b>bold</b> and <i>it</i>", "bold and it"),
        ('<a href="https://x.y/?a=1&amp;b=2">link</a>', "link"),
        ('<span class="tg-spoiler">s</span><tg-spoiler>t</tg-spoiler>', "st"),
        ("<pre><code class=\"language-py\">x &lt; 1</code></pre>", "x < 1"),
        ("&lt;answer&gt; &amp; &quot;q&quot; &#65;&#x42;", '<answer> & "q" AB'),
        ("AT&T &copy; &unknown;", "AT&T &copy; &unknown;"),  # not entities: kept as text
        ("<B>upper</B>", "upper"),
    ],
)
def test_html_shows_the_text_without_its_markup(text: str, shown: str) -> None:
    assert parse_html(text) == shown


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("❓ Deploy? <answer>", 'Unsupported start tag "answer" at byte offset 12'),
        ("a < b", 'Unsupported start tag "" at byte offset 2'),
        ("<b>open", 'Can\'t find end tag corresponding to start tag "b"'),
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("x</b>", "Unexpected end tag at byte offset 1"),
        ("<b", "Unclosed start tag at byte offset 0"),
        ('<span class="x">s</span>', 'Tag "span" must have class "tg-spoiler" at byte offset 0'),
        ("<br>", 'Unsupported start tag "br" at byte offset 0'),
    ],
)
def test_html_refuses_what_telegram_refuses(text: str, error: str) -> None:
    with pytest.raises(ParseError) as refused:
        parse_html(text)
    assert str(refused.value) == error


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("hello\\. world\\!", "hello. world!"),
        ("*bold* _it_ __u__ ~s~ ||sp||", "bold it u s sp"),
        ("[text](https://x.y/a\\)b)", "text"),
        ("`a_b*c` and ```py\nx = 1\n```", "a_b*c and x = 1\n"),
        ("\\(invalid\\_schema\\)", "(invalid_schema)"),
        ("> quoted\nline", "quoted\nline"),
    ],
)
def test_markdown_v2_shows_the_text_without_its_markup(text: str, shown: str) -> None:
    assert parse_markdown_v2(text) == shown


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("hello. world", "Character '.' is reserved and must be escaped with the preceding '\\'"),
        ("a-b", "Character '-' is reserved and must be escaped with the preceding '\\'"),
        ("(x)", "Character '(' is reserved and must be escaped with the preceding '\\'"),
        ("a | b", "Character '|' is reserved and must be escaped with the preceding '\\'"),
        ("x *open", "Can't find end of Bold entity at byte offset 2"),
        ("snake_case", "Can't find end of Italic entity at byte offset 5"),
    ],
)
def test_markdown_v2_refuses_an_unescaped_reserved_character(text: str, error: str) -> None:
    with pytest.raises(ParseError) as refused:
        parse_markdown_v2(text)
    assert str(refused.value) == error


def test_without_a_parse_mode_the_text_is_shown_as_sent_less_its_outer_whitespace() -> None:
    assert render("  <answer> *x* \n", None) == "<answer> *x*"
