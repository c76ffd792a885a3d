"""X12: text that cannot be UTF-8 stops at the wire, and never breaks a write for others.

JSON can spell a lone surrogate (`"\\ud800"`); Python holds it; SQLite, the log,
argv and Telegram cannot. These tests pin where it is refused and that one such
item never stops the bridge for anyone else.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import QuestionSpec, SendResponse
from coms_hermes_bridge.messages.contract import Rejected, parse_prompt, validate_answer
from coms_hermes_bridge.messages.wire import (
    AnswerFile,
    CancelEnvelope,
    PromptEnvelope,
    has_lone_surrogate,
    invalid_text,
)
from tests.fakes import prompt_envelope

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
LONE = "a\ud800b"

PROMPT: dict[str, Any] = prompt_envelope(QID, text="Ship it?", sender_cwd="/work/app").json_body()
CANCEL = {
    "type": "cancel",
    "msg_id": "01ARZ3NDEKTSV4RRFFQ69G5FAW",
    "from": "builder",
    "to": "user-remote",
    "created_at": "2026-11-30T12:00:05.000Z",
    "ref_msg_id": QID,
}
ANSWER = {"qid": QID, "answer": "yes", "answered_by": "telegram:alice",
          "at": "2026-11-30T12:01:00.000Z"}


def _refusal(model: type[Any], body: dict[str, Any]) -> str | None:
    try:
        model.model_validate(body)
    except ValidationError as exc:
        return invalid_text(exc)
    return "accepted"


@pytest.mark.parametrize("field", [k for k in PROMPT if k != "type"])
def test_a_prompt_with_a_lone_surrogate_names_the_field(field: str) -> None:  # X12
    value = PROMPT[field]
    bad = LONE if not isinstance(value, str) else value + "\udc80"
    assert _refusal(PromptEnvelope, {**PROMPT, field: bad}) == f"{field} is not valid Unicode"


@pytest.mark.parametrize("bad", [{"k": ["x", LONE]}, [{"\udfff": 1}], {LONE: None}])
def test_a_lone_surrogate_deep_in_a_json_field_or_a_key_is_found(bad: Any) -> None:  # X12
    assert _refusal(PromptEnvelope, {**PROMPT, "response_schema": bad}) == (
        "response_schema is not valid Unicode"
    )


def test_an_unknown_field_is_ignored_whatever_it_holds() -> None:  # W18, X12
    assert _refusal(PromptEnvelope, {**PROMPT, "extra": LONE}) == "accepted"


@pytest.mark.parametrize("field", [k for k in CANCEL if k != "type"])
def test_a_cancel_with_a_lone_surrogate_names_its_wire_field(field: str) -> None:  # X12, W16
    assert _refusal(CancelEnvelope, {**CANCEL, field: LONE}) == f"{field} is not valid Unicode"


@pytest.mark.parametrize("field", list(ANSWER))
def test_an_answer_file_with_a_lone_surrogate_is_invalid_schema_naming_the_field(
    field: str,
) -> None:  # X12, C9
    body = {**ANSWER, field: ANSWER[field] + "\ud800"}
    content = json.dumps(body).encode()
    assert validate_answer(f"{QID}.answer.json", content, {QID}) == Rejected(
        "invalid_schema", QID, f"{field} is not valid Unicode"
    )


def test_other_schema_faults_carry_no_error_text() -> None:  # C9: the log detail as before
    content = json.dumps({**ANSWER, "answer": 3}).encode()
    assert validate_answer(f"{QID}.answer.json", content, {QID}) == Rejected(
        "invalid_schema", QID, None
    )


def test_a_valid_answer_file_with_astral_text_is_accepted() -> None:  # X12 refuses no real text
    body = {**ANSWER, "answer": "ok 🚀 \U0010ffff é"}
    assert AnswerFile.model_validate(body).answer == "ok 🚀 \U0010ffff é"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(
        st.characters(exclude_categories=())
    ),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(st.characters(exclude_categories=()), max_size=4), inner,
                      max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_has_lone_surrogate_is_exactly_what_utf8_cannot_encode(value: Any) -> None:  # X12
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
        encodable = True
    except UnicodeEncodeError:
        encodable = False
    assert has_lone_surrogate(value) is not encodable


def test_depth_costs_no_stack() -> None:  # bounded work, whatever the nesting
    value: Any = LONE
    for _ in range(100_000):
        value = [value]
    assert has_lone_surrogate(value)


# -- the store: one bad item never fails a write for others ----------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "state.sqlite3")
    yield s
    s.shutdown()


def _spec(qid: str = QID, **fields: Any) -> QuestionSpec:
    prompt = PromptEnvelope.model_validate({**PROMPT, "msg_id": qid, **fields})
    return QuestionSpec(qid=qid, prompt=prompt, parsed=parse_prompt(prompt),
                        timeout_ms=1000.0, deadline=2_000_000_000.0)


def _outbox_qids(store: Store) -> list[str]:
    with sqlite3.connect(store.path) as conn:
        return [q for (q,) in conn.execute("SELECT qid FROM outbox ORDER BY rowid")]


def test_a_settle_that_cannot_be_stored_fails_alone(store: Store) -> None:  # X12
    # the poison settle: refused to its caller (the Peer says it), nothing held up by it
    other = "01ARZ3NDEKTSV4RRFFQ69G5FAX"
    store.put_open(_spec(other), owner="o")
    store.close(other, "answered", owner="o",
                response=SendResponse(_spec(other).prompt, {"kind": "freeform", "text": "y"}))
    assert _outbox_qids(store) == [other]
    with pytest.raises(UnicodeEncodeError):
        store.settle("x\ud800y")  # what the poison line's error response would settle
    store.settle(other, "o")
    assert _outbox_qids(store) == []
    store.put_open(_spec(), owner="q")  # later writes are not held up by it
    assert store.load()[0] == [_spec()]


def test_an_open_row_whose_parsed_question_is_not_unicode_is_dropped_on_read(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:  # X12: every column read back, the question as parsed too
    store.put_open(_spec(), owner="o")
    with sqlite3.connect(store.path) as conn:  # an older version's row, or a hand edit
        conn.execute("UPDATE open_questions SET parsed = CAST(? AS TEXT) WHERE qid = ?",
                     (b'{"question":"a\xff"}', QID))
    assert store.load() == ([], [])
    assert f"dropped open question '{QID}'" in capsys.readouterr().err
    # a lone surrogate the asker spelt as a JSON escape is text, written escaped: kept
    kept = _spec("01ARZ3NDEKTSV4RRFFQ69G5FAX", prompt='{"question": "a\\ud800"}')
    assert kept.parsed.question == "a\ud800"
    store.put_open(kept, owner="p")
    assert store.load()[0] == [kept]


def test_rows_with_text_that_is_not_unicode_are_dropped_on_read(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:  # X12: the same check for what is read back from the state file
    store.put_open(_spec(), owner="o")
    good = "01ARZ3NDEKTSV4RRFFQ69G5FAX"
    store.put_open(_spec(good), owner="p")
    store.close(good, None, owner="p",
                response=SendResponse(_spec(good).prompt, None, "failed"))
    with sqlite3.connect(store.path) as conn:  # an older version's rows, or a hand edit
        conn.execute("UPDATE open_questions SET prompt = ? WHERE qid = ?",
                     (json.dumps({**PROMPT, "sender_name": LONE}), QID))
        conn.execute("UPDATE outbox SET prompt = CAST(? AS TEXT) WHERE qid = ?",
                     (json.dumps({**PROMPT, "msg_id": good}).encode() + b"\xff", good))
        conn.execute("INSERT INTO notes (id, qid, purpose, text)"
                     " VALUES ('n1', ?, 'late_note', CAST(? AS TEXT))", (QID, b"bad \xff"))
        conn.execute("INSERT INTO closed_questions (qid, state)"
                     " VALUES (CAST(? AS TEXT), 'answered')", (b"01ARZ3NDEKTSV4RRFFQ69G5F\xff\xfe",))
    assert store.load() == ([], [])
    assert store.outbox() == []
    assert store.owed_notes() == []
    err = capsys.readouterr().err
    assert f"dropped open question '{QID}'" in err
    assert f"dropped a response owed for '{good}'" in err
    assert f"dropped a note owed for '{QID}'" in err
    assert "dropped closed question" in err
    capsys.readouterr()
    assert (store.load(), store.outbox(), store.owed_notes()) == (([], []), [], [])
    assert capsys.readouterr().err == ""  # said once: the rows are gone
