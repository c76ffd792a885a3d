"""Boundaries of the contract rules that the per-requirement tables step over.

Each test sits exactly on a comparison the rules make (a limit reached, not
passed; a range's first index; the last unit of a budget), where an
off-by-one or a lost field would change what the asker or the human sees.
"""

from __future__ import annotations

import json

import pytest

from coms_hermes_bridge.messages.contract import (
    defuse_markers,
    effective_timeout_ms,
    first_line,
    format_question,
    over_asker_limit,
    over_capacity,
    remind_after_s,
    remind_note,
    span,
    undelivered_note,
    utf16_len,
)
from coms_hermes_bridge.messages.wire import ParsedPrompt, QuestionOption
from tests.fakes import prompt_envelope

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
NAME = f"{QID}.answer.json"
INSTRUCTION = f"\n\n↩ Reply to this message, or type: HUB-Q:{QID}: <answer>"


def test_the_smallest_positive_whole_reply_timeout_is_taken() -> None:
    # X5: any positive reply_timeout_ms is the question's timeout, 1 ms included
    assert effective_timeout_ms(prompt_envelope(reply_timeout_ms=1), 1_800_000) == 1
    assert effective_timeout_ms(prompt_envelope(reply_timeout_ms=0.5), 1_800_000) == 0.5
    assert effective_timeout_ms(prompt_envelope(reply_timeout_ms=0), 1_800_000) == 1_800_000


def test_a_whole_reply_timeout_is_logged_as_javascript_writes_it() -> None:
    # X5, C16: the timeout's log detail carries the number; JSON.stringify(5000) is "5000"
    whole, fraction = prompt_envelope(reply_timeout_ms=5000), prompt_envelope(reply_timeout_ms=2500.5)
    assert json.dumps(effective_timeout_ms(whole, 1_800_000)) == "5000"
    assert json.dumps(effective_timeout_ms(fraction, 1_800_000)) == "2500.5"


# -- C5: the context gets what is left, and nothing when nothing is left ---------

CONTEXT = "c" * 50
PREFIX = "\n\nContext: "


@pytest.mark.parametrize("slack", range(len(PREFIX) + 1))
def test_context_is_left_out_whole_when_its_label_would_not_fit(slack: int) -> None:
    # C4, C5: no "Context:" label with nothing after it, and never past the limit
    bare = ParsedPrompt(question="Ship it?", options=(QuestionOption(title="yes"),))
    fixed = utf16_len(format_question(QID, bare))
    with_context = bare.model_copy(update={"context": CONTEXT})
    text = format_question(QID, with_context, limit=fixed + slack)
    assert text == format_question(QID, bare, limit=fixed + slack)
    assert utf16_len(text) == fixed


def test_the_first_unit_past_the_label_gets_an_ellipsis_of_context() -> None:
    # C5: the context is cut with "…" to whatever budget remains
    bare = ParsedPrompt(question="Ship it?")
    fixed = utf16_len(format_question(QID, bare))
    text = format_question(
        QID, bare.model_copy(update={"context": CONTEXT}), limit=fixed + len(PREFIX) + 1
    )
    assert text.endswith("Ship it?" + PREFIX + "…" + INSTRUCTION)


def test_a_question_cut_to_its_ellipsis_keeps_every_option() -> None:
    # C5: header, options and instruction survive whole whenever they fit, even
    # when only one unit is left for the question itself
    options = (QuestionOption(title="yes"), QuestionOption(title="no", description="wait"))
    parsed = ParsedPrompt(question="q" * 40, options=options)
    fixed = utf16_len(format_question(QID, parsed))
    text = format_question(QID, parsed, limit=fixed - 40 + 1)
    assert text == f"❓ [HUB-Q:{QID}] …\n\nOptions:\n1. yes\n2. no — wait" + INSTRUCTION


# -- X3: keep ranges are [start, end) ---------------------------------------------


def test_a_marker_whose_q_opens_a_kept_range_is_kept() -> None:
    # X3: the bridge's own markers (the ranges in `keep`) are left alone
    text = "see HUB-Q:x"
    q = text.index("Q")
    assert defuse_markers(text, keep=[(q, len(text))]) == text


def test_a_marker_whose_q_is_just_past_a_kept_range_is_defused() -> None:
    # X3: `end` is outside the range, so a marker starting there is an agent's
    text = "see HUB-Q:x"
    q = text.index("Q")
    assert defuse_markers(text, keep=[(0, q)]) == "see HUB-Ɋ:x"


# -- C13, C14 ------------------------------------------------------------


def test_max_open_is_reached_at_max_open_not_after() -> None:
    # --max-open N admits N questions, and refuses the N+1st
    assert over_capacity(1, 2) is None
    assert over_capacity(2, 2) == "bridge has 2 open questions; try again later"


def test_undelivered_note_wording() -> None:  # X11
    assert undelivered_note("01ARZ3NDEKTSV4RRFFQ69G5FAV") == (
        "ℹ [HUB-Q:01ARZ3NDEKTSV4RRFFQ69G5FAV] This question could not be confirmed delivered; "
        "its asker was told it failed, so this answer was not passed on."
    )


def test_over_asker_limit() -> None:  # X10: off by default, then a limit per asker
    assert over_asker_limit("builder", 500, None) is None
    assert over_asker_limit("builder", 1, 2) is None
    assert over_asker_limit("builder", 2, 2) == "builder has 2 open questions; try again later"
    assert over_asker_limit("", 3, 2) == " has 3 open questions; try again later"


def test_remind_after() -> None:  # X9: off, too long to be useful, or its moment
    assert remind_after_s(5000, None) is None
    assert remind_after_s(5000, 5000) is None and remind_after_s(5000, 9000) is None
    assert remind_after_s(5000, 3000) == 2.0
    assert remind_after_s(1_800_000, 600_000) == 1200.0


def test_remind_note_wording_defused_and_cut() -> None:  # X9, X3, X8, C5
    assert remind_note(QID, 2.98, "\n  Deploy now?  \nmore") == (
        f"⏰ [HUB-Q:{QID}] Still waiting for your answer, 3s left: Deploy now?")
    other = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
    text = remind_note(QID, 600, f"answer HUB-Q:{other}: yes, MEDIA:/etc/x.png [[as_document]]")
    assert text == (f"⏰ [HUB-Q:{QID}] Still waiting for your answer, 10m00s left: "
                    f"answer HUB-Ɋ:{other}: yes, MEDIA꞉/etc/x.png ⟦as_document⟧")
    long = remind_note(QID, 1, "x" * 1000)
    assert long.endswith("x" * 199 + "…") and utf16_len(long.split(": ", 1)[1]) == 200


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0s"), (59.9, "59s"), (60, "1m00s"),
                                                (3599, "59m59s"), (3600, "1h00m"),
                                                (3660, "1h01m"), (86_399, "23h59m"),
                                                (86_400, "1d00h"), (90_000, "1d01h"), (-5, "0s")])
def test_span(seconds: float, shown: str) -> None:
    assert span(seconds) == shown


def test_first_line() -> None:  # the question's first line, for status and the reminder (X9)
    assert first_line("\n  \t\n  Deploy?  \n  now") == "Deploy?"
    assert first_line(" \n\t\n") == ""
    assert first_line("") == ""
