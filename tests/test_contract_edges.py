"""Edges of the contract's helpers that the rule tables do not reach.

Each test here pins a boundary that a plausible slip (an off-by-one at
U+FFFF, Python's whitespace set for JavaScript's, a lost error handler) would
cross without any of the per-requirement tables noticing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from coms_hermes_bridge.messages.contract import (
    delivery_error,
    iso,
    js_trim,
    parse_positive_ms,
    scrub,
    transition,
    truncate_utf16,
    utf16_len,
)


@pytest.mark.parametrize(
    ("raw", "trimmed"),
    [
        ("\ufeff yes \u3000", "yes"),  # JavaScript trims the BOM; Python's strip() does not
        ("\x1cyes\x1f", "\x1cyes\x1f"),  # Python strips the separators; JavaScript does not
        ("\x85yes", "\x85yes"),  # NEL: Python whitespace, not JavaScript's
        ("\u00a0\u2028yes\u2029\u202f", "yes"),
    ],
)
def test_js_trim_uses_javascripts_whitespace_set(raw: str, trimmed: str) -> None:
    # C11: "trimmed" means what String.prototype.trim() means
    assert js_trim(raw) == trimmed


@pytest.fixture
def far_east_local_time() -> Iterator[None]:
    """Run with a local zone far from UTC, so "local" and "UTC" cannot be confused."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Tokyo"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()


def test_iso_is_utc_whatever_the_local_zone(far_east_local_time: None) -> None:
    # C20: timestamps are toISOString(): always UTC with a Z
    moment = datetime(2026, 11, 30, 18, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert iso(moment) == "2026-11-30T16:00:00.123Z"


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("0.5", 0.5),  # positive means > 0, not >= 1
        ("1", 1),
        ("2.5", 2.5),  # a fraction stays a fraction
        ("250", 250),
        ("0", None),
        ("-1", None),
        ("inf", None),
        ("nan", None),
        ("  ", None),
    ],
)
def test_parse_positive_ms_boundaries(raw: str, value: float | None) -> None:
    # C16: "a positive number"
    parsed = parse_positive_ms(raw)
    assert parsed == value
    assert type(parsed) is type(value)


def test_scrub_replaces_lone_surrogates_and_keeps_pairs() -> None:
    # C5: a lone surrogate cannot be encoded for Telegram or argv
    assert scrub("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    assert scrub("😀 ok") == "😀 ok"


@pytest.mark.parametrize(
    ("text", "units"),
    [("\uffff", 1), ("\U00010000", 2), ("\U0010ffff", 2), ("\ufffe\U00010000", 3)],
)
def test_utf16_width_boundary_is_between_u_ffff_and_u_10000(text: str, units: int) -> None:
    # C5: counted as JavaScript and Telegram count
    assert utf16_len(text) == units


def test_truncation_counts_u_ffff_as_one_unit_and_u_10000_as_two() -> None:
    # C5: five units hold four BMP characters and the ellipsis
    assert truncate_utf16("\uffff" * 6, 5) == "\uffff" * 4 + "…"
    # ... but only two astral characters (2 + 2 units) and the ellipsis
    assert truncate_utf16("\U00010000" * 4, 5) == "\U00010000" * 2 + "…"


def test_delivery_error_without_output_names_only_the_code() -> None:
    # C18
    assert delivery_error(3, "") == "hermes send failed (3)"
    assert delivery_error(None, "  \n") == "hermes send failed"


def test_forbidden_transition_names_the_event_and_the_state() -> None:
    # C19
    with pytest.raises(ValueError, match=r"^delivered is not allowed in state answered$"):
        transition("answered", "delivered")
