"""The extensions' pure rules, table by table (X1-X5)."""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime

import pytest
from dateutil import parser as dateutil_parser

from coms_hermes_bridge.messages.contract import (
    MAX_REPLY_TIMEOUT_MS,
    Accepted,
    admission,
    cancel_refused_record,
    defuse_markers,
    duplicate_error,
    duplicate_refused_record,
    effective_timeout_ms,
    format_question,
    log_record,
    map_answer,
    may_cancel,
    parse_prompt,
    project_label,
    utf16_len,
    validate_answer,
)
from coms_hermes_bridge.messages.wire import (
    CancelEnvelope,
    FreeformAnswer,
    ParsedPrompt,
    PromptEnvelope,
    QuestionOption,
    SelectionAnswer,
    _zone,
    parse_timestamp,
)
from tests.fakes import prompt_envelope

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
OTHER = "01ARZ3NDEKTSV4RRFFQ69G5FAW"
THIRD = "01J9Z8Y7X6W5V4T3S2R1Q0P9NM"


# X4: `at` as JavaScript's Date.parse takes it ---------------------

ACCEPTED_AT = [
    "2026-11-30T18:00:00.000Z",  # what JavaScript itself writes
    "2026-11-30T18:00:00Z",
    "2026-11-30T18:00:00",
    "2026-11-30 18:00:00",  # space instead of T
    "2026-11-30T18:00:00+02:00",
    "2026-11-30T18:00:00+0200",
    "2026-11-30T18:00:00.123456789Z",  # more digits than microseconds
    "2026-11-30T18:00:00,5Z",  # comma fraction
    "2026-11-30T18:00Z",
    "2026-11-30",
    "2026-11",
    "2026",
    "20261130T180000Z",
    "Mon, 30 Nov 2026 18:00:00 +0000",  # RFC 2822, date -R
    "Mon, 30 Nov 2026 18:00:00 GMT",
    "30 Nov 2026 18:00:00 -0500",
    "Mon Nov 30 18:00:00 UTC 2026",  # date's default output
    "Mon Nov 30 18:00:00 EST 2026",
    "Mon Nov 30 18:00:00 CET 2026",  # a zone JavaScript does not know: kept, not lost
    "Mon Nov 30 2026 18:00:00 GMT+0100 (Central European Standard Time)",  # Date.toString()
    "Tue Nov 30 18:00:00 UTC 2026",  # a wrong weekday is ignored, as JavaScript does
    "  2026-11-30T18:00:00Z  ",
]

REFUSED_AT = [
    "",
    "   ",
    "yesterday",
    "now",
    "Monday",
    "18:00",  # a time without a date
    "Nov",
    "1",
    "2026-13-45",
    "2026-11-31",  # no such day
    "2026-11-30T25:00:00Z",
    "2026-11-30 later",
    "hello 2026",
    "2026-11-30T18:00:00Z" + " " * 200,  # long, however padded
    "9" * 120,
]


@pytest.mark.parametrize("at", ACCEPTED_AT)
def test_at_forms_javascript_accepts_are_accepted(at: str) -> None:
    # X4, C8
    parse_timestamp(at)
    body = {"qid": QID, "answer": "yes", "answered_by": "telegram:alice", "at": at}
    verdict = validate_answer(f"{QID}.answer.json", json.dumps(body).encode(), {QID})
    assert isinstance(verdict, Accepted)


@pytest.mark.parametrize("at", REFUSED_AT)
def test_garbage_at_is_refused(at: str) -> None:
    # X4, C9: invalid_schema
    with pytest.raises(ValueError):
        parse_timestamp(at)
    body = {"qid": QID, "answer": "yes", "answered_by": "telegram:alice", "at": at}
    verdict = validate_answer(f"{QID}.answer.json", json.dumps(body).encode(), {QID})
    assert verdict.reason == "invalid_schema"  # type: ignore[union-attr]


def test_at_is_read_up_to_100_characters_and_refused_past_them() -> None:
    # X4, bounded: padding counts, so the work on any `at` has a bound
    at = "2026-11-30T12:00:00Z"
    assert parse_timestamp(at.ljust(100)) == datetime(2026, 11, 30, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"^timestamp too long$"):
        parse_timestamp(at.ljust(101))


@pytest.mark.parametrize("at", [
    *(at for at in ACCEPTED_AT if re.match(r"\s*\d{4}-\d{2}-\d{2}[T ]", at)),
    "2026-11-30T18:00:00.5-05:30",
    "2026-02-29T00:00:00Z",
    "2026-11-30T24:00:00Z",
])
def test_quick_iso_reading_agrees_with_the_general_one(at: str) -> None:
    # X4: the quick path for plain ISO reads the same instant dateutil reads
    text = at.strip()
    try:
        general = dateutil_parser.parse(text, default=datetime(2000, 1, 1), tzinfos=_zone)
    except ValueError:  # 2026-02-29: no such day, refused both ways
        with pytest.raises(ValueError):
            parse_timestamp(at)
        return
    assert parse_timestamp(at).isoformat() == general.isoformat()


@pytest.mark.parametrize(
    ("at", "iso"),
    [
        ("Mon Nov 30 18:00:00 UTC 2026", "2026-11-30T18:00:00+00:00"),
        ("Mon, 30 Nov 2026 18:00:00 +0000", "2026-11-30T18:00:00+00:00"),
        ("Mon Nov 30 18:00:00 PDT 2026", "2026-11-30T18:00:00-07:00"),
        ("Mon Nov 30 2026 18:00:00 GMT+0100 (CET)", "2026-11-30T18:00:00+01:00"),
        ("2026-11-30 18:00:00", "2026-11-30T18:00:00"),
        ("2026-11", "2026-11-01T00:00:00"),
    ],
)
def test_at_is_read_as_javascript_reads_it(at: str, iso: str) -> None:
    # X4: the instant, not just "it parses" (GMT+0100 is one hour east, as in JavaScript)
    assert parse_timestamp(at).isoformat() == iso


# X3: only the bridge writes markers ----------------------------

# A lenient reading of a marker, independent of the code under test: what a
# matcher that normalises, ignores case and invisible characters would find.
_LENIENT = re.compile(r"hub[\W_]*q[\W_]*([0-9a-z]{26})(?![0-9a-z])")


def lenient_qids(text: str) -> list[str]:
    plain = "".join(
        ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf"
    ).casefold()
    return [qid.upper() for qid in _LENIENT.findall(plain)]


STRICT = re.compile(r"HUB-Q\s*:\s*([0-9A-HJKMNP-TV-Z]{26})")


@pytest.mark.parametrize(
    ("text", "defused"),
    [
        (f"[HUB-Q:{OTHER}]", f"[HUB-Ɋ:{OTHER}]"),
        (f"HUB-Q:{OTHER}: yes", f"HUB-Ɋ:{OTHER}: yes"),
        (f"hub-q:{OTHER}", f"hub-ɋ:{OTHER}"),  # lower case
        (f"Hub-Q : {OTHER}", f"Hub-Ɋ : {OTHER}"),  # spaces around the colon
        (f"HUB-Q：{OTHER}", f"HUB-Ɋ：{OTHER}"),  # full-width colon
        (f"HUB-Q∶{OTHER}", f"HUB-Ɋ∶{OTHER}"),  # ratio sign
        (f"HUB Q:{OTHER}", f"HUB Ɋ:{OTHER}"),
        (f"HUB–Q:{OTHER}", f"HUB–Ɋ:{OTHER}"),  # en dash
        (f"HUB_Q:{OTHER}", f"HUB_Ɋ:{OTHER}"),
        (f"HUBQ:{OTHER}", f"HUBɊ:{OTHER}"),
        (f"HUB-Q {OTHER}", f"HUB-Ɋ {OTHER}"),  # no colon, but a qid right after
        (f"H\u200bUB-\u200dQ:{OTHER}", f"H\u200bUB-\u200dɊ:{OTHER}"),  # zero-width inside
        (f"ＨＵＢ－Ｑ：{OTHER}", f"ＨＵＢ－Ɋ：{OTHER}"),  # full-width letters
        (f"𝐇𝐔𝐁-𝐐:{OTHER}", f"𝐇𝐔𝐁-Ɋ:{OTHER}"),  # astral mathematical letters
        (f"😀HUB-Q:{OTHER}😀", f"😀HUB-Ɋ:{OTHER}😀"),  # astral characters around
        (f"НUВ-Q:{OTHER}", f"НUВ-Ɋ:{OTHER}"),  # Cyrillic look-alikes
        (f"HUB-Ԛ:{OTHER}", f"HUB-Ɋ:{OTHER}"),  # Cyrillic Qa
        (f"HUB-Q\u0332:{OTHER}", f"HUB-Ɋ\u0332:{OTHER}"),  # combining mark after Q
        ("a HUB-Q: b HUB-Q: c", "a HUB-Ɋ: b HUB-Ɋ: c"),  # every one, without a qid too
        (f"HUB-Ɋ:{OTHER}", f"HUB-Ɋ:{OTHER}"),  # already defused: unchanged
        # not markers: left exactly as written
        ("the hub quickly", "the hub quickly"),
        ("HUB-Q is our tag", "HUB-Q is our tag"),
        ("GitHub queue: 3", "GitHub queue: 3"),
        ("", ""),
    ],
)
def test_defusing_table(text: str, defused: str) -> None:
    # X3
    assert defuse_markers(text) == defused
    assert lenient_qids(defused) == []
    assert utf16_len(defused) <= utf16_len(text)  # C5: never longer


def test_defusing_keeps_what_the_bridge_wrote() -> None:
    # X3
    ours = f"[HUB-Q:{QID}] "
    text = ours + f"HUB-Q:{OTHER}"
    assert defuse_markers(text, keep=((0, len(ours)),)) == ours + f"HUB-Ɋ:{OTHER}"


SPOOF = f"[HUB-Q:{OTHER}] ↩ Reply to this message, or type: HUB-Q:{OTHER}: <answer>"


def spoofed_prompt() -> PromptEnvelope:
    body = {
        "question": f"Approve? {SPOOF}",
        "context": f"hub-q : {THIRD} is the real one",
        "options": [
            {"title": f"Yes HUB-Q:{OTHER}", "description": f"HUB-Q：{THIRD}"},
            {"title": "No HUB-", "description": "x"},
            f"Q:{OTHER} split",  # a marker split across option lines
            f"ＨＵＢ－Ｑ {THIRD}",
        ],
    }
    return prompt_envelope(text=json.dumps(body), sender_name=f"HUB-Q:{OTHER}")


@pytest.mark.parametrize("project", [None, f"HUB-Q:{OTHER}"])
def test_question_text_carries_only_the_bridges_markers(project: str | None) -> None:
    # X3, C4: the header and the reply line are the only markers, for our qid
    text = format_question(QID, parse_prompt(spoofed_prompt()), project=project)
    assert STRICT.findall(text) == [QID, QID]
    assert lenient_qids(text) == [QID, QID]
    assert text.startswith(f"❓ [HUB-Q:{QID}] Approve? [HUB-Ɋ:{OTHER}]")
    assert text.endswith(f"\n\n↩ Reply to this message, or type: HUB-Q:{QID}: <answer>")
    # the agent's words are all still there
    for words in ("is the real one", f"1. Yes HUB-Ɋ:{OTHER} — HUB-Ɋ：{THIRD}", "2. No HUB- — x",
                  f"3. Q:{OTHER} split", f"4. ＨＵＢ－Ɋ {THIRD}"):
        assert words in text


def test_plain_prompt_sender_name_is_defused() -> None:
    # X3: the sender name reaches Telegram in the plain prompt's context (C6)
    spoofed = prompt_envelope(text="Go?", sender_name=f"HUB-Q:{OTHER}", sender_cwd="/work/a")
    text = format_question(QID, parse_prompt(spoofed))
    assert f"Context: From HUB-Ɋ:{OTHER} @ /work/a" in text
    assert lenient_qids(text) == [QID, QID]


def test_defused_titles_still_map() -> None:
    # X3, C11: by number, by the original title, and by the title as the human saw it
    parsed = parse_prompt(spoofed_prompt())
    first = parsed.options[0].title
    assert first == f"Yes HUB-Q:{OTHER}"
    expected = SelectionAnswer(selections=(first,))
    assert map_answer("1", parsed.options) == expected
    assert map_answer(f"yes hub-q:{OTHER}", parsed.options) == expected
    assert map_answer(f"Yes HUB-Ɋ:{OTHER}", parsed.options) == expected
    assert map_answer("HUB-Ɋ", parsed.options) == FreeformAnswer(text="HUB-Ɋ")


def test_defusing_keeps_the_budget() -> None:
    # X3, C5: markers everywhere, astral characters around them, still at most 4096 units
    parsed = ParsedPrompt(
        question=f"😀HUB-Q:{OTHER}😀" * 40,
        context=f"𝐇𝐔𝐁-𝐐:{OTHER}" * 500,
        options=(QuestionOption(title=f"HUB-Q:{OTHER}", description="😀" * 10),),
    )
    text = format_question(QID, parsed, project="p")
    assert utf16_len(text) <= 4096
    assert lenient_qids(text) == [QID, QID]
    assert text.encode("utf-16-le").decode("utf-16-le") == text


# X4: the project line ----------------------------------------

INSTRUCTION = f"\n\n↩ Reply to this message, or type: HUB-Q:{QID}: <answer>"


def test_project_line_follows_the_header() -> None:
    # X4: `\n\n📁 Project: <project>` right after the header, C4 otherwise unchanged
    parsed = ParsedPrompt(
        question="Ship?", context="CI green", options=(QuestionOption(title="Yes"),)
    )
    assert format_question(QID, parsed, project="shop") == (
        f"❓ [HUB-Q:{QID}] Ship?\n\n📁 Project: shop\n\nContext: CI green\n\nOptions:\n1. Yes"
        + INSTRUCTION
    )


@pytest.mark.parametrize(
    ("project", "label"),
    [
        ("shop", "shop"),
        ("", "default"),
        (" \t\n", "default"),
        ("  my \n\t project  ", "my project"),
        ("p" * 128, "p" * 128),
        ("p" * 129, "p" * 127 + "…"),
        ("😀" * 64, "😀" * 64),
        ("😀" * 65, "😀" * 63 + "…"),
    ],
)
def test_project_label(project: str, label: str) -> None:
    # X4: whitespace collapsed, at most 128 UTF-16 units, `default` when empty
    assert project_label(project) == label
    assert utf16_len(label) <= 128


def test_project_line_is_inside_the_budget_and_context_gets_the_rest() -> None:
    # X4, C5
    parsed = ParsedPrompt(question="Q", context="x" * 10_000, options=(QuestionOption(title="A"),))
    text = format_question(QID, parsed, project="shop")
    assert utf16_len(text) == 4096
    assert text.startswith(f"❓ [HUB-Q:{QID}] Q\n\n📁 Project: shop\n\nContext: xxx")
    assert text.endswith("x…\n\nOptions:\n1. A" + INSTRUCTION)


def test_huge_question_keeps_header_project_options_and_reply_line() -> None:
    # X4, C5: the question is cut, the rest survives whole
    parsed = ParsedPrompt(question="q" * 5000, context="dropped", options=(QuestionOption(title="A"),))
    text = format_question(QID, parsed, project="shop")
    assert utf16_len(text) == 4096
    assert text.startswith(f"❓ [HUB-Q:{QID}] qqq")
    assert text.endswith("q…\n\n📁 Project: shop\n\nOptions:\n1. A" + INSTRUCTION)
    assert "Context" not in text


def test_tiny_limit_still_ends_with_the_reply_line() -> None:
    # C5: when even the header does not fit, the reply instruction still does
    text = format_question(QID, ParsedPrompt(question="Q" * 50), 80, project="shop")
    assert utf16_len(text) <= 80 and text.endswith(INSTRUCTION)


# X5: the asker's own timeout --------------------------------

@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 1_800_000),
        (400, 400),
        (400.0, 400),
        (250.5, 250.5),
        (3_600_000, 3_600_000),  # longer than the default is the asker's right
        (MAX_REPLY_TIMEOUT_MS, MAX_REPLY_TIMEOUT_MS),
        (MAX_REPLY_TIMEOUT_MS + 1, MAX_REPLY_TIMEOUT_MS),  # capped at 24 h
        (10**30, MAX_REPLY_TIMEOUT_MS),
        (0, 1_800_000),
        (-5, 1_800_000),
        ("400", 1_800_000),  # a JSON number only
        (True, 1_800_000),
        ([400], 1_800_000),
        ({"ms": 400}, 1_800_000),
    ],
)
def test_effective_timeout(raw: object, expected: float) -> None:
    # X5, C16
    assert MAX_REPLY_TIMEOUT_MS == 86_400_000
    assert effective_timeout_ms(prompt_envelope(reply_timeout_ms=raw), 1_800_000) == expected


# X2: ownership -------------------------------------------

A = prompt_envelope(text="Ship?")


@pytest.mark.parametrize(
    ("incoming", "open_prompt", "closed", "expected"),
    [
        (A, None, False, "admit"),
        (A, A, False, "retry"),  # identical resend by its asker
        # the same asker is endpoint and text; the rest of the envelope may differ
        (prompt_envelope(text="Ship?", sender_session="other", timestamp="later"), A, False,
         "retry"),
        (prompt_envelope(text="Ship?", sender_endpoint="/tmp/b.sock"), A, False, "open"),
        (prompt_envelope(text="Ship now?"), A, False, "open"),
        (prompt_envelope(text="Ship?", sender_name="agent-b", sender_endpoint="/tmp/b.sock"),
         A, False, "open"),
        (A, None, True, "closed"),  # recently closed
        (A, A, True, "retry"),  # open wins over a stale closed entry
    ],
)
def test_admission(
    incoming: PromptEnvelope, open_prompt: PromptEnvelope | None, closed: bool, expected: object
) -> None:
    # X2
    assert admission(incoming, open_prompt, closed) == expected


def test_duplicate_error_text() -> None:
    # X2
    assert duplicate_error(QID) == f"qid {QID} is already in use"


def cancel(sender: str) -> CancelEnvelope:
    return CancelEnvelope.model_validate(
        {"type": "cancel", "msg_id": "c1", "from": sender, "to": "user-remote",
         "created_at": "2026-11-30T12:00:00.000Z", "ref_msg_id": QID}
    )


@pytest.mark.parametrize(
    ("sender", "asker", "honoured"),
    [
        ("agent-a", "agent-a", True),
        ("evil", "agent-a", False),
        ("Agent-A", "agent-a", False),  # names are exact
        ("agent-a ", "agent-a", False),
        ("agent-a", "", False),  # a prompt without a name can be cancelled by nobody
        ("XXXX", "XXXX", True),  # any name its asker gives, however it looks
    ],
)
def test_only_the_asker_cancels(sender: str, asker: str, honoured: bool) -> None:
    # X2
    assert may_cancel(cancel(sender), prompt_envelope(sender_name=asker)) is honoured


AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_refusal_log_records() -> None:
    # X1, X2: the claimed sender, bounded like every log line
    claimed = prompt_envelope(sender_name="agent-b")
    assert json.loads(duplicate_refused_record(AT, QID, claimed, "closed").to_line("p")) == {
        "at": "2026-11-30T12:00:00.000Z", "qid": QID, "event": "duplicate_refused",
        "detail": {"from": "agent-b", "reason": "closed"}, "project": "p",
    }
    assert json.loads(cancel_refused_record(AT, cancel("evil")).to_line("p")) == {
        "at": "2026-11-30T12:00:00.000Z", "qid": QID, "event": "cancel_refused",
        "detail": {"from": "evil"}, "project": "p",
    }
    long = cancel_refused_record(AT, cancel("e" * 5000)).detail
    assert long == {"from": "e" * 127 + "…"}


@pytest.mark.parametrize("event", ["duplicate_refused", "cancel_refused", "response_failed"])
def test_extension_events_are_log_events(event: str) -> None:
    # X1: C20's list extended, never changed
    record = log_record(datetime(2026, 11, 30, tzinfo=UTC), QID, event, {"from": "evil"})  # type: ignore[arg-type]
    assert json.loads(record.to_line("p"))["event"] == event
