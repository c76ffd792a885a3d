"""Wire and file models: parse what the pool sends, write what it expects (W5, W12-W18, C8)."""

from __future__ import annotations

import json
import sys
import threading

import pytest
from pydantic import ValidationError

from coms_hermes_bridge.messages import wire
from coms_hermes_bridge.messages.wire import (
    LINE_LIMIT,
    Ack,
    AgentCard,
    AnswerFile,
    CancelEnvelope,
    LogRecord,
    Nack,
    PingEnvelope,
    Pong,
    PromptEnvelope,
    RegistryEntry,
    ResponseEnvelope,
    SelectionAnswer,
    dumps,
    fit_line,
    invalid_text,
    loads,
    loads_envelope,
    parse_timestamp,
)

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"

PROMPT = {
    "type": "prompt",
    "msg_id": QID,
    "sender_session": "01J9Z8Y7X6W5V4T3S2R1Q0P9NM",
    "sender_endpoint": "/home/u/.pi/coms/sockets/01J9Z8Y7X6W5V4T3S2R1Q0P9NM.sock",
    "hops": 0,
    "timestamp": "2026-11-30T12:00:00.000Z",
    "prompt": '{"question":"Ship?"}',
    "sender_name": "builder",
    "sender_cwd": "/work/app",
    "conversation_id": None,
    "response_schema": None,
    "reply_timeout_ms": 600000,
    "trace": {"span": "x"},
    "future_field": [1, 2],
}


def test_prompt_parses_with_extra_fields_and_serialises_with_wire_keys() -> None:
    # W14, W18
    env = PromptEnvelope.model_validate(PROMPT)
    assert env.msg_id == QID and env.hops == 0 and env.reply_timeout_ms == 600000
    out = json.loads(env.to_json())
    expected = {k: v for k, v in PROMPT.items() if k not in ("trace", "future_field")}
    assert out == expected
    assert list(out) == list(expected)


@pytest.mark.parametrize(
    "change",
    [
        {"msg_id": None},
        {"msg_id": 5},
        {"prompt": None},
        {"prompt": {"question": "x"}},
        {"sender_endpoint": None},
        {"hops": None},
        {"hops": "0"},
        {"hops": True},
        {"type": "response"},
    ],
)
def test_prompt_lacking_a_required_field_is_not_a_prompt(change: dict[str, object]) -> None:
    # W14: msg_id, prompt, sender_endpoint strings and hops a number
    data = {**PROMPT, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ValidationError):
        PromptEnvelope.model_validate(data)


def test_minimal_prompt_is_a_prompt() -> None:
    # W14: only the four fields the pool checks are required
    env = PromptEnvelope.model_validate(
        {"type": "prompt", "msg_id": "x", "prompt": "hi", "sender_endpoint": "/s", "hops": 1.5}
    )
    assert env.hops == 1.5 and env.sender_name == ""


def test_response_serialises_exactly() -> None:
    # W15: null where the wire has null, keys in the pool's order
    env = ResponseEnvelope(
        msg_id=QID,
        sender_session="01J9Z8Y7X6W5V4T3S2R1Q0P9NM",
        sender_endpoint="/s/me.sock",
        timestamp="2026-11-30T12:00:00.000Z",
        response=None,
        error="no remote answer within 250ms",
    )
    assert env.to_line() == (
        '{"type":"response","msg_id":"' + QID + '","sender_session":"01J9Z8Y7X6W5V4T3S2R1Q0P9NM",'
        '"sender_endpoint":"/s/me.sock","hops":0,"timestamp":"2026-11-30T12:00:00.000Z",'
        '"response":null,"error":"no remote answer within 250ms"}\n'
    ).encode()
    ok = env.model_copy(update={"response": {"kind": "freeform", "text": "é"}, "error": None})
    assert '"response":{"kind":"freeform","text":"é"},"error":null}' in ok.to_json()
    parsed = ResponseEnvelope.model_validate({**json.loads(ok.to_json()), "extra": 1})
    assert parsed == ok


CANCEL = {
    "type": "cancel",
    "msg_id": "01J9Z8Y7X6W5V4T3S2R1Q0P9NN",
    "from": "builder",
    "to": "user-remote",
    "created_at": "2026-11-30T12:00:05.000Z",
    "ref_msg_id": QID,
    "reason": "console answered",
}


def test_cancel_parses_with_extra_fields_and_serialises_with_from() -> None:
    # C12, W16, W18
    env = CancelEnvelope.model_validate(CANCEL)
    assert env.from_ == "builder" and env.ref_msg_id == QID
    assert json.loads(env.to_json()) == {k: v for k, v in CANCEL.items() if k != "reason"}


@pytest.mark.parametrize("field", ["msg_id", "from", "to", "created_at", "ref_msg_id"])
@pytest.mark.parametrize("bad", ["", None, 3])
def test_cancel_needs_every_field_non_empty(field: str, bad: object) -> None:
    # W16: all non-empty strings
    data = {**CANCEL, field: bad}
    if bad is None:
        del data[field]
    with pytest.raises(ValidationError):
        CancelEnvelope.model_validate(data)


def test_ping_and_replies() -> None:
    # W12, W17
    assert PingEnvelope.model_validate({"type": "ping", "msg_id": "p1", "x": 1}).msg_id == "p1"
    assert PingEnvelope.model_validate({"type": "ping"}).msg_id == ""
    assert Ack(msg_id="m").to_line() == b'{"type":"ack","msg_id":"m"}\n'
    assert Nack(msg_id="", error="invalid json").to_line() == (
        b'{"type":"nack","msg_id":"","error":"invalid json"}\n'
    )
    card = AgentCard(
        name="user-remote",
        purpose="Remote human via Hermes/Telegram",
        model="hermes-bridge",
        color="#38BDF8",
        context_used_pct=0,
        queue_depth=5,
    )
    assert Pong(msg_id="p1", agent_card=card).to_json() == (
        '{"type":"pong","msg_id":"p1","agent_card":{"name":"user-remote",'
        '"purpose":"Remote human via Hermes/Telegram","model":"hermes-bridge",'
        '"color":"#38BDF8","context_used_pct":0,"queue_depth":5}}'
    )


def test_json_body_is_plain_json_values() -> None:
    # W12: lists where the model holds tuples, as a JSON reader would hand them back
    body = SelectionAnswer(selections=("Ship", "Wait")).json_body()
    assert body == {"kind": "selection", "selections": ["Ship", "Wait"]}
    assert type(body["selections"]) is list


def test_registry_entry_is_written_like_the_pool_writes_it() -> None:
    # W5: every field, in order, two-space JSON
    entry = RegistryEntry(
        session_id="01J9Z8Y7X6W5V4T3S2R1Q0P9NM",
        name="user-remote",
        purpose="Remote human via Hermes/Telegram",
        model="hermes-bridge",
        color="#38BDF8",
        pid=4242,
        endpoint="/r/sockets/01J9Z8Y7X6W5V4T3S2R1Q0P9NM.sock",
        cwd="/work",
        started_at="2026-11-30T12:00:00.000Z",
        explicit=False,
        version=1,
        context_used_pct=0,
        queue_depth=0,
        heartbeat_at="2026-11-30T12:00:30.000Z",
    )
    text = entry.to_file_text()
    assert text.startswith('{\n  "session_id": "01J9Z8Y7X6W5V4T3S2R1Q0P9NM",\n  "name": "user-remote",')
    assert list(json.loads(text)) == [
        "session_id", "name", "purpose", "model", "color", "pid", "endpoint", "cwd",
        "started_at", "explicit", "version", "context_used_pct", "queue_depth", "heartbeat_at",
    ]  # fmt: skip
    assert RegistryEntry.model_validate_json(text) == entry


def test_registry_entry_text_is_exact_and_keeps_non_ascii_as_itself() -> None:
    # W5: JSON.stringify(entry, null, 2): ", " nowhere, ": " after keys, "é" as itself
    entry = RegistryEntry(session_id="s", name="café", endpoint="/e", purpose="ça va",
                          context_used_pct=12.5, heartbeat_at=None)
    assert entry.to_file_text() == (
        '{\n  "session_id": "s",\n  "name": "café",\n  "purpose": "ça va",\n  "model": "",\n'
        '  "color": "",\n  "pid": 0,\n  "endpoint": "/e",\n  "cwd": "",\n  "started_at": "",\n'
        '  "explicit": false,\n  "version": 1,\n  "context_used_pct": 12.5,\n'
        '  "queue_depth": 0,\n  "heartbeat_at": null\n}'
    )


def test_registry_entry_of_another_peer_reads_leniently() -> None:
    # W9, W18: an older peer's entry without heartbeat or queue depth
    entry = RegistryEntry.model_validate(
        {"session_id": "s", "name": "builder", "endpoint": "/e", "pid": 1, "extra": True}
    )
    assert entry.heartbeat_at is None


def test_answer_file_model() -> None:
    # C8
    data = {"qid": QID, "answer": "2", "answered_by": "telegram:alice", "at": "2026-11-30T12:01:00Z"}
    assert AnswerFile.model_validate({**data, "message_id": 99}).answer == "2"
    for bad in ({"answered_by": ""}, {"at": "soon"}, {"qid": "x"}, {"answer": None}):
        with pytest.raises(ValidationError):
            AnswerFile.model_validate({**data, **bad})


def test_answer_file_qid_error_names_the_form() -> None:
    # C3, C8: the refusal says what a qid must be
    data = {"qid": "x", "answer": "2", "answered_by": "telegram:alice", "at": "2026-11-30T12:01:00Z"}
    with pytest.raises(ValidationError) as caught:
        AnswerFile.model_validate(data)
    assert [(e["loc"], e["msg"]) for e in caught.value.errors()] == [
        (("qid",), "Value error, not a 26-character Crockford ULID")
    ]


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("", "not a timestamp"),
        ("   ", "not a timestamp"),
        ("(comment only)", "not a timestamp"),
        ("hello", "not a timestamp: Unknown string format: hello"),
        ("Monday", "not a whole date"),
        ("12:00", "not a whole date"),
    ],
)
def test_a_refused_timestamp_says_why(at: str, message: str) -> None:
    # X4, C8: empty text, text no parser reads, and a time without its date
    with pytest.raises(ValueError) as caught:
        parse_timestamp(at)
    assert str(caught.value) == message


def test_dumps_escapes_lone_surrogates_and_keeps_unicode() -> None:
    # W12: every line is valid UTF-8
    assert dumps({"t": "é😀\ud800"}) == '{"t":"é😀\\ud800"}'
    assert dumps({"t": "é😀\ud800"}).encode("utf-8")


def test_indented_dumps_writes_like_json_stringify() -> None:
    # W5, W12: non-ASCII as itself, "," at line ends and ": " after keys, as
    # JSON.stringify(value, null, 2) writes
    assert dumps({"t": "é😀", "l": [1, {}]}, indent=2) == (
        '{\n  "t": "é😀",\n  "l": [\n    1,\n    {}\n  ]\n}'
    )


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_dumps_refuses_what_json_cannot_hold(indent: int | None, number: float) -> None:
    # W12: NaN and Infinity are not JSON; no peer could read such a line
    with pytest.raises(ValueError) as caught:
        dumps({"n": number}, indent=indent)
    # (the indented writer appends the value, the compact one does not)
    assert str(caught.value).startswith("Out of range float values are not JSON compliant")


def test_log_record_omits_absent_detail() -> None:
    # C20
    rec = LogRecord(at="2026-11-30T12:00:00.000Z", qid=QID, event="timeout", detail={"timeout_ms": 5})
    assert rec.to_line("p").endswith('"event":"timeout","detail":{"timeout_ms":5},"project":"p"}\n')


def test_prompt_descriptive_fields_are_taken_as_they_come() -> None:
    # W18: only msg_id, prompt, sender_endpoint and hops are checked
    env = PromptEnvelope.model_validate(
        {
            "type": "prompt", "msg_id": QID, "prompt": "hi", "sender_endpoint": "/s", "hops": 0,
            "sender_name": None, "sender_cwd": 7, "timestamp": None,
            "reply_timeout_ms": "30000", "conversation_id": 12, "response_schema": [1],
        }
    )  # fmt: skip
    assert (env.sender_name, env.sender_cwd, env.timestamp) == ("", "7", "")
    assert env.reply_timeout_ms == "30000" and env.conversation_id == 12


# -- bounded lines (W13) ---------------------------------------------


def test_a_line_that_fits_is_written_exactly_as_dumps_writes_it() -> None:
    body = {"a": "x" * 1000, "b": [1, "é"]}
    assert fit_line(body) == dumps(body) + "\n"


def test_a_line_of_exactly_the_limit_is_kept_and_one_byte_more_is_cut() -> None:  # W13
    # the limit counts the newline: `limit` bytes in all is a line that fits
    overhead = len(dumps({"text": ""})) + 1
    exact = {"text": "x" * (100 - overhead)}
    assert fit_line(exact, limit=100) == dumps(exact) + "\n"
    assert len(fit_line(exact, limit=100).encode("utf-8")) == 100
    over = {"text": "x" * (101 - overhead)}
    cut = fit_line(over, limit=100)
    assert len(cut.encode("utf-8")) <= 100 and json.loads(cut)["text"].endswith("…")


def test_a_line_with_no_text_to_cut_is_written_whole() -> None:  # W13
    # numbers and one-character texts cannot be shortened: the line is not mangled
    body = {"n": list(range(60)), "t": ["a"] * 30}
    assert fit_line(body, limit=50) == dumps(body) + "\n"


def test_two_character_texts_are_cut_to_the_ellipsis_alone() -> None:  # W13
    # a two-character text is the shortest that can be cut, and keeps nothing but "…"
    body = {"t": ["😀😀"] * 4}
    assert fit_line(body, limit=40) == '{"t":["…","…","…","…"]}\n'


def test_the_common_size_saves_what_is_over_and_never_goes_below_nothing() -> None:
    # W13: fit_line's arithmetic. Cutting 10 to 7 saves 3 (5 stays); 3 cannot save 10,
    # so everything goes; nothing to cut gives nothing
    assert wire._cap([10, 5], 3) == 7
    assert wire._cap([5, 10], 8) == 3  # in any order: 10 and 5 both cut to 3
    assert wire._cap([3], 10) == 0
    assert wire._cap([], 5) == 0


def test_the_longest_texts_anywhere_in_the_value_are_cut_to_one_common_size() -> None:
    # W13: texts in lists and nested objects alike, each to the same encoded size (within
    # a character of rounding); the short ones, keys and the shape stay as they were,
    # and the cut ones keep their start
    body = {"a": "s" * 10, "b": ["x" * 300, {"c": "y" * 200, "d": "z" * 40}], "e": "w" * 100}
    cut = {"a": "s" * 10, "b": ["x" * 77 + "…", {"c": "y" * 77 + "…", "d": "z" * 40}],
           "e": "w" * 76 + "…"}
    assert fit_line(body, limit=400) == dumps(cut) + "\n"


def test_a_text_at_the_common_size_is_not_cut() -> None:  # W13
    # cutting 100 encoded bytes to 50 saves what is over: the text of exactly 50 stays
    body = {"a": "a" * 98, "b": "b" * 48}
    limit = len(dumps(body).encode("utf-8")) + 1 - 18
    assert fit_line(body, limit) == dumps({"a": "a" * 49 + "…", "b": "b" * 48}) + "\n"


def test_a_cut_text_always_loses_at_least_two_characters() -> None:  # W13
    # the common size (100 bytes) would keep 49 of the 50 "é": a cut keeps at most 48,
    # so that with its "…" it is never as long as it was
    body = {"a": "a" * 298, "b": "é" * 50}
    limit = len(dumps(body).encode("utf-8")) + 1 - 170
    assert fit_line(body, limit) == dumps({"a": "a" * 99 + "…", "b": "é" * 48 + "…"}) + "\n"


def test_a_line_still_over_after_a_cut_is_cut_again() -> None:  # W13
    # the cut keeps characters in proportion, but here the kept ones are the wide ones:
    # the first cut leaves the line over the limit by a byte, and a second cut fixes it
    body = ["😀" * 7 + "x" * 12]
    assert fit_line(body, limit=35) == '["😀😀😀…"]\n'


def test_a_cut_that_lands_on_the_limit_exactly_is_final() -> None:  # W13
    # the newline counts: a line of `limit` bytes in all fits and is not cut further
    body = ["😀" * 12 + "x" * 7]
    line = fit_line(body, limit=56)
    assert line == '["' + "😀" * 12 + '…"]\n' and len(line.encode("utf-8")) == 56


@pytest.mark.parametrize("unit", ["x", "é", "\n", "😀", '"'])
def test_long_texts_are_cut_with_an_ellipsis_under_64_kib(unit: str) -> None:
    body = {"msg_id": QID, "error": "hermes send failed (1): " + unit * 200_000,
            "response": {"answer": unit * 100_000}}
    line = fit_line(body)
    assert len(line.encode("utf-8")) <= LINE_LIMIT < 64 * 1024
    assert line.endswith("\n") and line.count("\n") == 1 + line[:-1].count("\n")
    parsed = json.loads(line)
    assert parsed["msg_id"] == QID  # short fields are untouched
    assert parsed["error"].startswith("hermes send failed (1): ")
    assert parsed["error"].endswith("…") or parsed["response"]["answer"].endswith("…")
    assert len(line.encode("utf-8")) > LINE_LIMIT - 200  # cut to the limit, not far below


def test_an_oversize_response_envelope_stays_one_valid_line() -> None:  # W13
    env = ResponseEnvelope(msg_id=QID, sender_session="s", sender_endpoint="/e",
                           timestamp="2026-11-30T12:00:00.000Z", response=None,
                           error="x" * 70_000)
    line = env.to_line()
    assert len(line) <= LINE_LIMIT and line.endswith(b"\n")
    parsed = json.loads(line)
    assert parsed["type"] == "response" and parsed["error"].endswith("…")


def test_an_oversize_log_record_stays_one_valid_line() -> None:  # C20
    record = LogRecord(at="2026-11-30T12:00:00.000Z", qid=QID, event="delivery_error",
                       detail={"phase": "question", "error": "e" * 100_000})
    line = record.to_line("p")
    assert len(line.encode("utf-8")) <= LINE_LIMIT
    assert json.loads(line)["detail"]["error"].endswith("…")
    assert json.loads(line)["project"] == "p"  # X16


def test_a_cancel_line_keeps_its_wire_field_names() -> None:  # W16
    cancel = CancelEnvelope.model_validate(
        {"type": "cancel", "msg_id": "m", "from": "a", "to": "b", "created_at": "t",
         "ref_msg_id": QID})
    assert json.loads(cancel.to_line())["from"] == "a"


def test_a_copys_json_text_is_its_own() -> None:
    envelope = PromptEnvelope(msg_id="x", sender_endpoint="/e", hops=0, prompt="first")
    text = envelope.to_json()
    assert '"prompt":"first"' in text
    changed = envelope.model_copy(update={"prompt": "second"})
    assert '"prompt":"second"' in changed.to_json()
    assert changed != envelope and envelope.to_json() == text
    assert envelope == PromptEnvelope(msg_id="x", sender_endpoint="/e", hops=0, prompt="first")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 199 + "[],[]" + "]" * 199,  # 201 brackets, none deeper than the bound
        "[" * 100 + "]," + "[" * 101 + "]" * 101 + "]" * 99,  # a deep branch after a closed one
        json.dumps(["[{" * 300]),  # brackets in a string are text
        json.dumps(['\\" ' + "[" * 300]),  # an escaped quote does not end the string
    ],
)
def test_json_up_to_the_bound_is_read_whatever_its_bracket_count(text: str) -> None:
    # W12: only nesting counts, not how many brackets the text holds
    assert loads(text) == json.loads(text)


def test_json_too_deep_for_the_parser_is_refused_not_raised() -> None:
    with pytest.raises(ValueError) as caught:
        loads("[" * 100_000 + "]" * 100_000)
    assert str(caught.value) == "JSON nested too deep"


def test_text_within_the_bound_that_is_not_json_gets_the_parsers_reason() -> None:
    with pytest.raises(ValueError) as caught:
        loads("[" * 200 + "X" + "]" * 200 + "[]")
    assert str(caught.value) == "Expecting value: line 1 column 201 (char 200)"


def test_json_on_a_thread_with_no_stack_left_is_refused_not_raised() -> None:
    # within the bound, but the caller's stack is nearly used up: still a ValueError
    results: list[object] = []

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
            return
        try:
            results.append(loads("[" * 200 + "]" * 200))
        except ValueError as exc:
            results.append(str(exc))

    thread = threading.Thread(target=deep, args=(sys.getrecursionlimit() - 150,))
    thread.start()
    thread.join()
    assert results == ["JSON nested too deep"]


@pytest.mark.parametrize("text", ["NaN", '{"a":Infinity}', "[1,-Infinity]", '{"n":NaN}'])
def test_nan_and_infinity_are_not_json(text: str) -> None:
    # C9, W13: JavaScript's JSON.parse refuses them, so every reader here does too
    with pytest.raises(ValueError, match="not JSON"):
        loads(text)


@pytest.mark.parametrize("text", ['\ufeff{"a":1}', "\ufeff[]"])
def test_text_led_by_a_byte_order_mark_is_not_json(text: str) -> None:
    # W12: JSON.parse refuses it (a BOM is not JSON whitespace), and so does every reader here
    with pytest.raises(ValueError, match="Expecting value: line 1 column 1"):
        loads(text)


def test_a_cut_never_makes_a_line_longer() -> None:  # W13
    # "ab" cut to "…" would be 3 bytes for 2: a line that cannot be made to fit is left as
    # dumps writes it, never made longer
    value = {"t": ["ab"] * 30}
    assert fit_line(value, limit=50) == dumps(value) + "\n"
    mixed = {"t": ["ab"] * 3, "u": "x" * 100}  # the long text is still cut; "ab" is kept
    line = fit_line(mixed, limit=60)
    assert len(line.encode("utf-8")) <= 60
    assert loads(line)["t"] == ["ab"] * 3


def test_a_one_character_text_is_never_cut_even_a_wide_one() -> None:  # W13
    # "😀" is 6 bytes as JSON and "…" 5: shorter, but it would say nothing the character
    # did not, so a line of one-character texts is written whole
    value = ["😀"] * 10
    assert fit_line(value, limit=50) == dumps(value) + "\n"


def test_a_text_of_wide_characters_at_exactly_the_common_size_is_kept() -> None:  # W13
    # the common size is 8 bytes, which "ééé" is as JSON: only what is over it is cut
    # (cut, it would keep "é…", 7 bytes)
    assert fit_line(["x" * 100, "ééé"], limit=52) == '["xxxxxxx…","ééé"]\n'


def test_a_cut_of_the_same_size_as_its_text_is_not_made() -> None:  # W13
    # "xé" is 3 bytes, as "…" is: the cut would save nothing and lose the text
    assert fit_line(["x" * 10, "xé"], limit=10) == '["…","xé"]\n'


def test_a_number_past_a_double_is_refused_and_every_other_read_as_written() -> None:  # W13
    for text, said in (("1e400", "1e400"), ("-1e400", "-1e400"), ("[1E+309]", "1E+309"),
                       ('{"a": 2e308}', "2e308"), ("9" * 400 + ".5", "9" * 32)):
        with pytest.raises(ValueError) as refused:
            loads(text)
        assert str(refused.value) == f"number out of range: {said}"  # bounded, as every line
    assert loads('[1.5, -0.0, 1e308, -1.7976931348623157e308, 5e-324, 1e-400, 7, 1e2]') == [
        1.5, -0.0, 1e308, -1.7976931348623157e308, 5e-324, 0.0, 7, 100.0]
    assert isinstance(loads("1e2"), float) and isinstance(loads("10"), int)


def test_a_line_on_the_socket_reads_a_number_past_a_double_as_json_parse_does() -> None:
    # X17, W13: Infinity for 1e400, so the envelope names its field; NaN and Infinity as
    # words are still no JSON, and every other reader still refuses 1e400 outright
    assert loads_envelope('{"hops": 1e400, "n": [-1E+999, 2.5, 7]}') == {
        "hops": float("inf"), "n": [float("-inf"), 2.5, 7]}
    for text in ("NaN", '{"a":Infinity}', "[" * 100_000 + "]" * 100_000):
        with pytest.raises(ValueError):
            loads_envelope(text)
    with pytest.raises(ValueError, match="number out of range"):
        loads('{"hops": 1e400}')


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"hops": float("inf")}, "hops is not a finite number"),
        ({"hops": float("-inf")}, "hops is not a finite number"),
        ({"reply_timeout_ms": float("inf")}, "reply_timeout_ms is not a finite number"),
        ({"response_schema": {"a": [{"b": float("inf")}]}},
         "response_schema holds a number that is not finite"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_naming_its_field(
    change: dict[str, object], why: str
) -> None:  # X17: no line we write, no row we store can hold it
    with pytest.raises(ValidationError) as caught:
        PromptEnvelope.model_validate({**PROMPT, **change})
    assert invalid_text(caught.value) == why
    assert PromptEnvelope.model_validate({**PROMPT, "trace": float("inf")}).hops == 0  # W18
