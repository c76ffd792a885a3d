"""The contract's pure rules, table by table (C3-C20)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from coms_hermes_bridge.messages.contract import (
    DEFAULT_TIMEOUT_MS,
    INVALID_QID_ERROR,
    UNREADABLE_REASONS,
    Accepted,
    Rejected,
    cancel_note,
    cancel_outcome,
    delivery_error,
    delivery_failure,
    format_question,
    grace_ms,
    is_group_target,
    iso,
    late_note,
    log_record,
    map_answer,
    parse_prompt,
    resolve_timeout_ms,
    timeout_error,
    timeout_note,
    transition,
    truncate_utf16,
    unreadable_note,
    utf16_len,
    validate_answer,
)
from coms_hermes_bridge.messages.wire import (
    FreeformAnswer,
    ParsedPrompt,
    QuestionOption,
    SelectionAnswer,
    is_valid_qid,
)
from tests.fakes import prompt_envelope

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
OTHER = "01ARZ3NDEKTSV4RRFFQ69G5FAW"


# C3 ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg_id", "valid"),
    [
        (QID, True),
        ("01J9Z8Y7X6W5V4T3S2R1Q0P9NM", True),
        ("01arz3ndektsv4rrffq69g5fav", False),  # lower case
        ("01ARZ3NDEKTSV4RRFFQ69G5FA", False),  # 25 chars
        ("01ARZ3NDEKTSV4RRFFQ69G5FAVX", False),  # 27 chars
        ("01ARZ3NDEKTSV4RRFFQ69G5FAI", False),  # I is not Crockford
        ("01ARZ3NDEKTSV4RRFFQ69G5FAL", False),  # L
        ("01ARZ3NDEKTSV4RRFFQ69G5FAO", False),  # O
        ("01ARZ3NDEKTSV4RRFFQ69G5FAU", False),  # U
        ("", False),
        ("not-a-ulid", False),
    ],
)
def test_a_qid_is_a_crockford_ulid(msg_id: str, valid: bool) -> None:
    # C3 (the Router takes a prompt's msg_id as its qid only when this holds)
    assert is_valid_qid(msg_id) is valid


def test_invalid_qid_error_text() -> None:
    # C3: the asker's error for a prompt that never reaches Telegram
    assert INVALID_QID_ERROR == "prompt msg_id must be a 26-character Crockford ULID qid"


# C6 ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Deploy now?",
            ParsedPrompt(question="Deploy now?", context="From builder @ /work/app"),
        ),
        (
            json.dumps({"question": "Ship?", "context": "CI green", "options": ["Yes", "No"]}),
            ParsedPrompt(
                question="Ship?",
                context="CI green",
                options=(QuestionOption(title="Yes"), QuestionOption(title="No")),
            ),
        ),
        (
            json.dumps(
                {
                    "question": "Which?",
                    "options": [
                        {"title": "Approve", "description": "Ship it"},
                        {"title": "Stop"},
                        {"title": "Odd", "description": 7},
                        {"description": "no title"},
                        {"title": 3},
                        42,
                        None,
                        ["nested"],
                    ],
                }
            ),
            ParsedPrompt(
                question="Which?",
                options=(
                    QuestionOption(title="Approve", description="Ship it"),
                    QuestionOption(title="Stop"),
                    QuestionOption(title="Odd"),
                ),
            ),
        ),
        (json.dumps({"question": "Q", "context": "   \n\t"}), ParsedPrompt(question="Q")),
        (json.dumps({"question": "Q", "context": 5}), ParsedPrompt(question="Q")),
        (json.dumps({"question": "Q", "options": "Yes"}), ParsedPrompt(question="Q")),
        # not a structured prompt: plain text with the sender's context
        (
            json.dumps({"question": 5}),
            ParsedPrompt(question='{"question": 5}', context="From builder @ /work/app"),
        ),
        ("[1, 2]", ParsedPrompt(question="[1, 2]", context="From builder @ /work/app")),
        ('"just a string"', ParsedPrompt(question='"just a string"', context="From builder @ /work/app")),
        ("{not json", ParsedPrompt(question="{not json", context="From builder @ /work/app")),
        # NaN and Infinity are not JSON (JSON.parse refuses them): plain text
        (
            '{"question":"q","x":Infinity}',
            ParsedPrompt(question='{"question":"q","x":Infinity}', context="From builder @ /work/app"),
        ),
        (
            '{"question":"q","x":NaN}',
            ParsedPrompt(question='{"question":"q","x":NaN}', context="From builder @ /work/app"),
        ),
        # nor is a number no double holds, for us: plain text, and the question still asked
        (
            '{"question":"q","x":1e400}',
            ParsedPrompt(question='{"question":"q","x":1e400}', context="From builder @ /work/app"),
        ),
    ],
)
def test_prompt_parsing(text: str, expected: ParsedPrompt) -> None:
    # C6
    # the plain prompt's context names the sender: builder @ /work/app
    assert parse_prompt(prompt_envelope(text=text, sender_cwd="/work/app")) == expected


# C4, C5 --------------------------------------------------------------------

HEADER = f"❓ [HUB-Q:{QID}] "
INSTRUCTION = f"\n\n↩ Reply to this message, or type: HUB-Q:{QID}: <answer>"


def test_question_text_with_context_and_options_with_and_without_descriptions() -> None:
    # C4
    parsed = ParsedPrompt(
        question="Ship the release?",
        context="CI is green on main.",
        options=(
            QuestionOption(title="Approve", description="Ship it"),
            QuestionOption(title="Revise", description="Request changes"),
            QuestionOption(title="Stop"),
        ),
    )
    assert format_question(QID, parsed) == (
        f"❓ [HUB-Q:{QID}] Ship the release?\n"
        "\n"
        "Context: CI is green on main.\n"
        "\n"
        "Options:\n"
        "1. Approve — Ship it\n"
        "2. Revise — Request changes\n"
        "3. Stop\n"
        "\n"
        f"↩ Reply to this message, or type: HUB-Q:{QID}: <answer>"
    )


def test_question_text_without_context_or_options() -> None:
    # C4: both blocks left out
    assert format_question(QID, ParsedPrompt(question="Ready?")) == HEADER + "Ready?" + INSTRUCTION


def test_question_text_options_without_context() -> None:
    # C4
    parsed = ParsedPrompt(question="Pick", options=(QuestionOption(title="A"),))
    assert format_question(QID, parsed) == HEADER + "Pick\n\nOptions:\n1. A" + INSTRUCTION


def test_in_a_group_the_typed_form_names_the_bot() -> None:
    # X14: a bot in a group gets only what mentions it or replies to it (the gateway
    # strips the mention); the rest of the text is C4's
    text = format_question(QID, ParsedPrompt(question="Ready?"), group=True)
    assert text == (HEADER + "Ready?\n\n↩ Reply to this message, or type: @<bot name> "
                    f"HUB-Q:{QID}: <answer>")


@pytest.mark.parametrize(("target", "group"), [
    ("telegram:-1001234567890", True), ("telegram:-1001234567890:17", True),
    ("telegram:-42", True), ("telegram", False), ("telegram:42", False),
    ("telegram:42:7", False), ("telegram:-", False), ("telegram:-x1", False),
    ("telegram:team", False), ("discord:-1", False), ("telegram:-1:2:3", False)])
def test_a_group_target_is_a_negative_telegram_chat_id(target: str, group: bool) -> None:
    assert is_group_target(target) is group  # X14


def test_empty_description_is_left_out() -> None:
    # C4
    parsed = ParsedPrompt(question="Pick", options=(QuestionOption(title="A", description=""),))
    assert "1. A\n" in format_question(QID, parsed) + "\n"
    assert " — " not in format_question(QID, parsed)


@pytest.mark.parametrize(("text", "units"), [("abc", 3), ("é", 1), ("😀", 2), ("a😀b", 4), ("", 0)])
def test_utf16_length(text: str, units: int) -> None:
    # C5: counted as Telegram/JavaScript count
    assert utf16_len(text) == units


def test_cap_with_astral_context_never_splits_a_surrogate_pair() -> None:
    # C5: 4096 UTF-16 units; each 😀 is 2 units
    parsed = ParsedPrompt(
        question="Read this?",
        context="😀" * 5000,
        options=(QuestionOption(title="Yes", description="go"), QuestionOption(title="No")),
    )
    text = format_question(QID, parsed)
    fixed = HEADER + "Read this?"
    tail = "\n\nOptions:\n1. Yes — go\n2. No" + INSTRUCTION
    assert utf16_len(text) <= 4096
    assert text.startswith(fixed + "\n\nContext: 😀")
    assert text.endswith("😀…" + tail)
    context = text[len(fixed + "\n\nContext: ") : -len(tail)]
    assert set(context[:-1]) == {"😀"}
    budget = 4096 - utf16_len(fixed) - utf16_len("\n\nContext: ") - utf16_len(tail)
    # as many whole emoji as fit beside the ellipsis, and no half of one
    assert utf16_len(context) in (budget, budget - 1)
    assert len(context[:-1]) == (budget - 1) // 2
    assert text.encode("utf-16-le").decode("utf-16-le") == text


def test_cap_exactly_reached_with_bmp_context() -> None:
    # C5
    parsed = ParsedPrompt(question="Q", context="x" * 10_000)
    text = format_question(QID, parsed)
    assert utf16_len(text) == 4096
    assert text.endswith("x…" + INSTRUCTION)


def test_context_that_fits_is_not_cut() -> None:
    # C5
    parsed = ParsedPrompt(question="Q", context="x" * 100)
    assert "Context: " + "x" * 100 + INSTRUCTION in format_question(QID, parsed)


def test_oversized_question_keeps_the_tag_and_the_instruction() -> None:
    # C5: header, options and instruction survive whole only when they fit;
    # when they cannot, the qid tag and the reply instruction still do.
    parsed = ParsedPrompt(question="q" * 5000, context="dropped")
    text = format_question(QID, parsed)
    assert utf16_len(text) == 4096
    assert text.startswith(HEADER + "qqq")
    assert text.endswith("q…" + INSTRUCTION)
    assert "Context" not in text


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("abcdef", 6, "abcdef"),
        ("abcdef", 5, "abcd…"),
        ("abcdef", 1, "…"),
        ("abcdef", 0, ""),
        ("a😀😀", 3, "a…"),  # 😀 needs 2 units; only 1 is left beside the …
        ("a😀😀", 4, "a😀…"),
        ("a😀😀", 5, "a😀😀"),
        ("😀😀😀", 5, "😀😀…"),
    ],
)
def test_truncate_utf16(text: str, limit: int, expected: str) -> None:
    # C5
    assert truncate_utf16(text, limit) == expected


# C13, C15, C17, C18 --------------------------------------------------------


def test_notes_and_errors_exact_text() -> None:
    # C13
    assert cancel_note(QID) == (
        f"✖ [HUB-Q:{QID}] The question was cancelled — it was answered from the console."
    )
    # C15
    assert late_note(QID) == (
        f"ℹ [HUB-Q:{QID}] This question is already closed; the late answer was ignored."
    )
    # C17
    assert timeout_note(QID, 250) == f"⌛ [HUB-Q:{QID}] The question timed out after 250ms."
    assert timeout_error(1_800_000) == "no remote answer within 1800000ms"
    assert timeout_error(250.5) == "no remote answer within 250.5ms"
    # X7
    assert unreadable_note(QID, "invalid_schema") == (
        f"⚠ [HUB-Q:{QID}] Your answer could not be read (invalid_schema); please reply again."
    )
    assert {"invalid_json", "invalid_schema", "qid_mismatch"} == UNREADABLE_REASONS


def test_a_cancel_by_the_operator_answers_the_asker_and_says_so() -> None:
    # C13: the asker's own cancel: the console note, no response, the envelope as reason
    assert cancel_outcome(QID, False) == (
        f"✖ [HUB-Q:{QID}] The question was cancelled — it was answered from the console.",
        None, {"reason": "cancel envelope"})
    # X15: the operator's: the asker gets an error, the human is told who cancelled
    assert cancel_outcome(QID, True) == (
        f"✖ [HUB-Q:{QID}] The question was cancelled by the operator.",
        "cancelled by the operator", {"by": "operator"})


@pytest.mark.parametrize(
    ("code", "stderr", "stdout", "expected"),
    [
        (3, "chat not found\n", "", "hermes send failed (3): chat not found"),
        (1, "", "bad token", "hermes send failed (1): bad token"),
        (1, "", "", "hermes send failed (1)"),
        (None, "", "", "hermes send failed"),
    ],
)
def test_delivery_error_text(code: int | None, stderr: str, stdout: str, expected: str) -> None:
    # C18: exit code and hermes' own stderr
    assert delivery_error(code, stderr, stdout) == expected


@pytest.mark.parametrize(
    ("code", "stderr", "parts"),
    [
        (3, "\n  chat not found  \nTraceback (most recent call last):\n", (3, "chat not found")),
        (-9, "", (-9, "")),
        (1, "(2): x", (1, "(2): x")),
        (None, "timed out after 60000ms", (None, "timed out after 60000ms")),
        (None, "", (None, "")),
    ],
)
def test_a_delivery_error_taken_apart_for_status(
    code: int | None, stderr: str, parts: tuple[int | None, str],
) -> None:  # C18's text back to hermes' exit status and its first line, as status shows them
    assert delivery_failure(delivery_error(code, stderr)) == parts
    assert delivery_failure("  something else\nentirely") == (None, "something else")


# C9, C10, C15 --------------------------------------------------------------


def body(**fields: object) -> bytes:
    base: dict[str, object] = {
        "qid": QID,
        "answer": "yes",
        "answered_by": "telegram:alice",
        "at": "2026-11-30T12:01:00.000Z",
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


NAME = f"{QID}.answer.json"


def test_valid_answer_is_accepted() -> None:
    # C8, C9
    verdict = validate_answer(NAME, body(), {QID})
    assert isinstance(verdict, Accepted)
    assert verdict.qid == QID
    assert verdict.answer.answer == "yes"
    assert verdict.answer.answered_by == "telegram:alice"


@pytest.mark.parametrize(
    ("name", "content", "pending", "expected"),
    [
        # each reason on its own
        (f"{QID}.json", body(), {QID}, Rejected("invalid_path")),
        (f"{QID}.answer.json.tmp", body(), {QID}, Rejected("invalid_path")),
        ("01arz3ndektsv4rrffq69g5fav.answer.json", body(), {QID}, Rejected("invalid_qid")),
        ("hello.answer.json", body(), {QID}, Rejected("invalid_qid")),
        (NAME, body(), {OTHER}, Rejected("foreign_qid", QID)),
        (NAME, b'{"qid": "', {QID}, Rejected("invalid_json", QID)),
        (NAME, b"", {QID}, Rejected("invalid_json", QID)),
        (NAME, b"\xff\xfe", {QID}, Rejected("invalid_json", QID)),
        # JSON.parse refuses NaN and Infinity: not JSON, wherever they stand
        (NAME, body()[:-1] + b', "n": NaN}', {QID}, Rejected("invalid_json", QID)),
        (NAME, body(answer=...)[:-1] + b', "answer": NaN}', {QID}, Rejected("invalid_json", QID)),
        (NAME, body()[:-1] + b', "n": Infinity}', {QID}, Rejected("invalid_json", QID)),
        (NAME, body()[:-1] + b', "n": [-Infinity]}', {QID}, Rejected("invalid_json", QID)),
        # a number past a double's range, which JSON.parse reads as Infinity
        (NAME, body()[:-1] + b', "n": 1e400}', {QID}, Rejected("invalid_json", QID)),
        (NAME, body()[:-1] + b', "n": [-1.5E+999]}', {QID}, Rejected("invalid_json", QID)),
        (NAME, b"[1]", {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(answer=...), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(answer=5), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(answered_by=""), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(answered_by=...), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(at="yesterday"), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(at="2026-13-45T99:00:00Z"), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(at=...), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(qid="nope"), {QID}, Rejected("invalid_schema", QID)),
        (NAME, body(qid=OTHER), {QID}, Rejected("qid_mismatch", QID)),
        # precedence
        ("bad.answer.txt", b"not json", set(), Rejected("invalid_path")),
        ("bad.answer.json", b"not json", set(), Rejected("invalid_qid")),
        (NAME, b"not json", {OTHER}, Rejected("foreign_qid", QID)),
        (NAME, b"not json", set(), Rejected("foreign_qid", QID)),
        (NAME, body(answer=5, qid=OTHER), {QID}, Rejected("invalid_schema", QID)),
        # a file over the size limit is not read (content None); its
        # name alone decides up to foreign_qid, and an open qid's is invalid_schema
        (NAME, None, {QID}, Rejected("invalid_schema", QID)),
        (NAME, None, {OTHER}, Rejected("foreign_qid", QID)),
        (NAME, None, set(), Rejected("foreign_qid", QID)),
        ("bad.answer.json", None, {QID}, Rejected("invalid_qid")),
        (f"{QID}.json", None, {QID}, Rejected("invalid_path")),
    ],
)
def test_rejection_reasons_and_their_order(
    name: str, content: bytes | None, pending: set[str], expected: Rejected
) -> None:
    # C9
    assert validate_answer(name, content, pending) == expected


def test_name_is_judged_before_anything_is_read() -> None:
    # C9: a bad name is invalid_qid even when the content cannot be decoded
    assert validate_answer("x.answer.json", b"\x00\xff", {QID}) == Rejected("invalid_qid")


def test_answer_at_accepts_iso_forms() -> None:
    # C8: `at` is an ISO timestamp that parses
    for at in ("2026-11-30T12:01:00Z", "2026-11-30T12:01:00.123+02:00", "2026-11-30"):
        assert isinstance(validate_answer(NAME, body(at=at), {QID}), Accepted)


@pytest.mark.parametrize(("poll", "grace"), [(1000, 2000), (100, 1000), (400, 1000), (600, 1200)])
def test_grace_window(poll: int, grace: int) -> None:
    # C10: max(2 × poll interval, 1 s)
    assert grace_ms(poll) == grace


# C11 -----------------------------------------------------------------------

OPTIONS = (
    QuestionOption(title="Approve", description="Ship it"),
    QuestionOption(title="Revise"),
    QuestionOption(title="Stop"),
)


@pytest.mark.parametrize(
    ("answer", "options", "expected"),
    [
        ("1", OPTIONS, SelectionAnswer(selections=("Approve",))),
        ("3", OPTIONS, SelectionAnswer(selections=("Stop",))),
        ("  2\n", OPTIONS, SelectionAnswer(selections=("Revise",))),
        ("02", OPTIONS, SelectionAnswer(selections=("Revise",))),
        ("approve", OPTIONS, SelectionAnswer(selections=("Approve",))),
        ("  STOP  ", OPTIONS, SelectionAnswer(selections=("Stop",))),
        ("\u00a0Revise\u3000", OPTIONS, SelectionAnswer(selections=("Revise",))),
        ("4", OPTIONS, FreeformAnswer(text="4")),
        ("0", OPTIONS, FreeformAnswer(text="0")),
        ("-1", OPTIONS, FreeformAnswer(text="-1")),
        ("1.0", OPTIONS, FreeformAnswer(text="1.0")),
        ("Approve it", OPTIONS, FreeformAnswer(text="Approve it")),
        ("  maybe later ", OPTIONS, FreeformAnswer(text="maybe later")),
        ("1", (), FreeformAnswer(text="1")),
        (" Approve ", (), FreeformAnswer(text="Approve")),
        ("", OPTIONS, FreeformAnswer(text="")),
    ],
)
def test_answer_mapping(answer: str, options: tuple[QuestionOption, ...], expected: object) -> None:
    # C11
    assert map_answer(answer, options) == expected


def test_mapped_answers_serialise_to_the_wire_shape() -> None:
    # C11
    assert SelectionAnswer(selections=("Stop",)).to_json() == '{"kind":"selection","selections":["Stop"]}'
    assert FreeformAnswer(text="ok").to_json() == '{"kind":"freeform","text":"ok"}'


# C16 -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": ""}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": "0"}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": "-5"}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": "abc"}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": "inf"}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": "nan"}, DEFAULT_TIMEOUT_MS),
        (None, {"PI_COMS_TIMEOUT_MS": "250"}, 250),
        (None, {"PI_COMS_TIMEOUT_MS": " 250 "}, 250),
        (5000, {"PI_COMS_TIMEOUT_MS": "250"}, 5000),
        (5000, {}, 5000),
    ],
)
def test_timeout_resolution(flag: int | None, env: dict[str, str], expected: int) -> None:
    # C16
    assert resolve_timeout_ms(flag, env) == expected
    assert isinstance(resolve_timeout_ms(flag, env), int)
    assert DEFAULT_TIMEOUT_MS == 1_800_000


# C19 -----------------------------------------------------------------------

ALLOWED = [
    (None, "question_received", "pending"),
    ("pending", "delivered", "delivered"),
    ("pending", "delivery_error", None),
    ("pending", "answered", "answered"),
    ("delivered", "answered", "answered"),
    ("pending", "cancelled", "cancelled"),
    ("delivered", "cancelled", "cancelled"),
    ("pending", "timeout", "timeout"),
    ("delivered", "timeout", "timeout"),
    ("answered", "late_answer", "answered"),
    ("cancelled", "late_answer", "cancelled"),
    ("timeout", "late_answer", "timeout"),
]


@pytest.mark.parametrize(("state", "event", "after"), ALLOWED)
def test_allowed_transitions(state: str | None, event: str, after: str | None) -> None:
    # C19
    assert transition(state, event) == after  # type: ignore[arg-type]


STATES = [None, "pending", "delivered", "answered", "cancelled", "timeout"]
EVENTS = [
    "question_received",
    "delivered",
    "delivery_error",
    "answered",
    "cancelled",
    "timeout",
    "late_answer",
]
FORBIDDEN = [
    (s, e) for s in STATES for e in EVENTS if (s, e) not in {(a, b) for a, b, _ in ALLOWED}
]


@pytest.mark.parametrize(("state", "event"), FORBIDDEN)
def test_every_other_transition_is_forbidden(state: str | None, event: str) -> None:
    # C19: "Nothing else." e.g. delivered + delivered, answered + timeout, none + answered
    with pytest.raises(ValueError, match=rf"^{event} is not allowed in state {state}$"):
        transition(state, event)  # type: ignore[arg-type]


def test_forbidden_set_includes_the_usual_suspects() -> None:
    # C19
    for pair in [
        ("delivered", "delivered"),
        ("delivered", "delivery_error"),
        ("answered", "timeout"),
        ("timeout", "answered"),
        (None, "answered"),
        ("pending", "question_received"),
        ("pending", "late_answer"),
    ]:
        assert pair in FORBIDDEN


# C20 -----------------------------------------------------------------------

AT = datetime(2026, 11, 30, 12, 0, 1, 234567, tzinfo=UTC)


def test_iso_is_javascripts_to_iso_string() -> None:
    # C20: "at" as the pool writes it
    assert iso(AT) == "2026-11-30T12:00:01.234Z"
    plus_two = AT.astimezone(timezone(timedelta(hours=2)))
    assert iso(plus_two) == "2026-11-30T12:00:01.234Z"


def test_log_record_rendering() -> None:
    # C20, X16: C20's fields in C20's order, then the project
    assert log_record(AT, QID, "question_received", {"from": "builder"}).to_line("p") == (
        '{"at":"2026-11-30T12:00:01.234Z","qid":"' + QID
        + '","event":"question_received","detail":{"from":"builder"},"project":"p"}\n'
    )
    assert log_record(AT, QID, "delivered").to_line("default") == (
        '{"at":"2026-11-30T12:00:01.234Z","qid":"' + QID
        + '","event":"delivered","project":"default"}\n'
    )
    # only an absent detail is left out: a null inside it stays, as JSON.stringify keeps it
    assert log_record(AT, QID, "answer_rejected", {"error": None, "n": [None]}).to_line("p") == (
        '{"at":"2026-11-30T12:00:01.234Z","qid":"' + QID
        + '","event":"answer_rejected","detail":{"error":null,"n":[null]},"project":"p"}\n'
    )


def test_rejection_log_record_without_a_qid() -> None:
    # C20: answer_rejected carries reason and file; no valid qid logs 000…0
    line = log_record(AT, None, "answer_rejected", {"reason": "invalid_qid", "file": "x.answer.json"})
    assert json.loads(line.to_line("p")) == {
        "at": "2026-11-30T12:00:01.234Z",
        "qid": "00000000000000000000000000",
        "event": "answer_rejected",
        "detail": {"reason": "invalid_qid", "file": "x.answer.json"},
        "project": "p",
    }
