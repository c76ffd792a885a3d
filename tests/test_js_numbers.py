"""Numbers as upstream reads and prints them (X17, within C16 and C17).

The daemon we replace reads its millisecond settings with JavaScript's Number()
and prints milliseconds with String(number). Python's float() and str() differ
from both at the edges (`1_000`, `inf`, full-width digits, `0x10`; `1e-07`,
`1000.0`), and each row below is one such edge.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from coms_hermes_bridge.messages.contract import (
    js_string,
    js_to_number,
    parse_positive_ms,
    resolve_timeout_ms,
    timeout_error,
    timeout_note,
)

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"

# Every space JavaScript's trim() removes: WhiteSpace (TAB, VT, FF, ZWNBSP and every
# Unicode Zs) and LineTerminator (LF, CR, LS, PS).
JS_SPACES = (
    "\t\v\f \u00a0\ufeff\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u202f\u205f\u3000\n\r\u2028\u2029"
)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        # hex, binary and octal, either case of prefix
        ("0x10", 16), ("0X10", 16), ("0xfF", 255), ("0b11", 3), ("0B11", 3),
        ("0o7", 7), ("0O17", 15),
        # decimals, with an exponent, a leading or trailing point, a sign
        ("1e3", 1000), ("1E+3", 1000), ("2.5e-1", 0.25), (".5", 0.5), ("5.", 5), ("+7", 7),
        ("250", 250), ("250.5", 250.5), ("1.5e-7", 1.5e-7), ("0012", 12),
        # JavaScript's whitespace around it, every kind of it
        (" 1000 ", 1000), ("\t\n\v\f\r1000\r\n", 1000), ("\u00a01000\ufeff", 1000),
        ("\u20281000\u2029", 1000), ("\u30001000\u1680", 1000), (JS_SPACES + "9" + JS_SPACES, 9),
        # past 2^31-1 ms (Node would fire such a timer after 1 ms): kept as it is
        ("3000000000", 3_000_000_000), ("0x80000000", 2**31),
    ],
)
def test_what_number_reads_is_taken(raw: str, value: float) -> None:  # X17, C16
    assert js_to_number(raw) == value
    assert parse_positive_ms(raw) == value
    assert resolve_timeout_ms(None, {"PI_COMS_TIMEOUT_MS": raw}) == value


@pytest.mark.parametrize(
    "raw",
    [
        "1_000",  # Python's float() reads the separator; Number() does not
        "１０００", "٣",  # full-width and Arabic-Indic digits: float() reads them too
        "inf", "nan", "infinity", "NaN",  # float() reads these; Number() says NaN
        "Infinity", "+Infinity", "-Infinity",  # Number() reads them: not finite
        "-0x10", "+0x10",  # no sign before a hex literal: NaN
        "0x", "0b2", "0o8", "0xG", "1e", "e5", ".", "+", "--5", "5e+", "1 2", "12abc",
        "", " ", JS_SPACES,  # Number() reads 0: not > 0
        "\x1c5", "5\x85", "\u180e5", "\u200b5",  # float() strips these; trim() does not
        "0", "-0", "-5", "0x0",  # not > 0
        "1e400", "0x" + "f" * 300,  # past a double: Infinity
        "1e-400",  # below the smallest double: 0
    ],
)
def test_what_number_cannot_read_or_is_not_positive_is_refused(raw: str) -> None:  # X17, C16
    assert parse_positive_ms(raw) is None
    assert resolve_timeout_ms(None, {"PI_COMS_TIMEOUT_MS": raw}) == 1_800_000


@pytest.mark.parametrize(
    ("raw", "value"),
    [("", 0.0), ("  ", 0.0), ("Infinity", math.inf), ("-Infinity", -math.inf),
     ("1e400", math.inf), ("-1e400", -math.inf), ("-0", -0.0), ("0x" + "f" * 300, math.inf)],
)
def test_number_itself_on_the_rows_that_are_then_refused(raw: str, value: float) -> None:
    # X17: what Number() gives for them (the refusal is parse_positive_ms's)
    assert js_to_number(raw) == value
    assert math.copysign(1, js_to_number(raw)) == math.copysign(1, value)
    for junk in ("1_000", "-0x10", "inf", "１"):
        assert math.isnan(js_to_number(junk))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        # whole numbers: no ".0"
        (1000.0, "1000"), (250, "250"), (0.0, "0"), (-0.0, "0"), (-5.0, "-5"),
        # up to 21 digits before the point: written out, padded with zeros
        (1e20, "100000000000000000000"), (123456789012345680000.0, "123456789012345680000"),
        (float(2**60), "1152921504606847000"), (2**60, "1152921504606847000"),
        # a fraction with digits before the point
        (250.5, "250.5"), (1.5, "1.5"), (-250.5, "-250.5"), (123456.789, "123456.789"),
        # down to 1e-6: 0. and zeros
        (0.5, "0.5"), (0.002, "0.002"), (1e-6, "0.000001"), (1.5e-6, "0.0000015"),
        # below 1e-6: exponent, e- and no padding
        (1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (-1e-7, "-1e-7"), (5e-324, "5e-324"),
        (1.23e-18, "1.23e-18"),
        # from 1e21: exponent, e+
        (1e21, "1e+21"), (1.5e21, "1.5e+21"), (1.7976931348623157e308, "1.7976931348623157e+308"),
        # not finite
        (math.inf, "Infinity"), (-math.inf, "-Infinity"), (math.nan, "NaN"),
    ],
)
def test_numbers_print_as_javascript_prints_them(value: float, text: str) -> None:  # X17
    assert js_string(value) == text


def test_milliseconds_in_the_timeout_texts_print_as_javascript_prints_them() -> None:
    # C17, X17: the upstream daemon's words, digit for digit
    assert timeout_note(QID, 1e-7) == f"⌛ [HUB-Q:{QID}] The question timed out after 1e-7ms."
    assert timeout_note(QID, 1000.0) == f"⌛ [HUB-Q:{QID}] The question timed out after 1000ms."
    assert timeout_error(1e-7) == "no remote answer within 1e-7ms"
    assert timeout_error(1e21) == "no remote answer within 1e+21ms"
    assert timeout_error(3_000_000_000.0) == "no remote answer within 3000000000ms"


@given(st.floats(allow_nan=False, allow_infinity=False))
@example(1e21)
@example(1e-7)
@example(9.999999999999999e20)
@example(1e-6)
@example(5e-324)
def test_what_is_printed_reads_back_as_the_same_number(value: float) -> None:  # X17
    text = js_string(value)
    assert js_to_number(text) == value  # the shortest digits that round-trip
    assert not text.endswith(".0") and "e+0" not in text and "e-0" not in text
    written_out = value == 0 or 1e-6 <= abs(value) < 1e21
    assert ("e" not in text) == written_out


@given(st.text())
@example("0x1_0")
@example("\u00a0")
@example("+.e1")
@example("１")
def test_number_never_fails_whatever_the_text(text: str) -> None:  # X17
    value = js_to_number(text)  # a float always: NaN for what it cannot read
    assert isinstance(value, float)
    if "_" in text or any(ch.isdigit() and not ch.isascii() for ch in text):
        assert math.isnan(value)  # what float() would have read
