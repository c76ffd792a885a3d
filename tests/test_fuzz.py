"""Property-based runs through the real wire, models, admission, store and watcher (X12).

One tree runs in this process (tests/tree_rig.py) with a fake hermes; hypothesis
generates hostile envelopes and answer files. The properties are what keeps a
pool working whatever one peer sends: every line gets exactly one reply line in
the bridge's own words, and afterwards an ordinary question is still acked and
answered (so the store is still writable and nothing is stuck). The same for
answer files: each is answered or refused as C9 says, and the question can still
be answered after it.

The normal suite runs a short profile; `just fuzz` runs the long one
(HYPOTHESIS_PROFILE=long, registered in tests/conftest.py).
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from ulid import ULID

from coms_hermes_bridge.messages.contract import (
    Accepted,
    map_answer,
    validate_answer,
)
from tests.fakes import wait_for
from tests.tree_rig import Tree, running_tree

MISSING = object()

# The bridge's own refusals (W13, W14, X2, X12); anything else in a nack,
# an exception's text above all, is a leak.
OUR_WORDS = re.compile(
    r"invalid json|line too large|bridge accepts prompts, cancels, and pings"
    r"|invalid (prompt|cancel) envelope(: [a-z_]+ (is not valid Unicode"
    r"|is not a finite number|holds a number that is not finite))?"  # X12, X17
    r"|qid \S+ is already in use|bridge has \d+ open questions; try again later",
    re.DOTALL,
)

odd = st.sampled_from([
    "\ud800", "x\ud800y", "\udfff", "\udc80", "\x00", "\u2028", "\ufeff", "",
    "HUB-Q:01ARZ3NDEKTSV4RRFFQ69G5FAV:", "MEDIA:/etc/passwd", "[[as_document]]", "'\"\\",
])
any_text = st.text(st.characters(exclude_categories=()), max_size=30)
texts = st.one_of(
    any_text, odd, st.builds(lambda a, b, c: a + b + c, any_text, odd, any_text)
)
numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=12,
)


def field(ordinary: Any) -> st.SearchStrategy[Any]:
    """A field as a careless or hostile peer fills it: as it should be, absent, or anything."""
    return st.one_of(st.just(ordinary), st.just(MISSING), texts, json_values)


def _qid() -> str:
    return str(ULID())


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    body = {
        "type": draw(st.one_of(st.sampled_from(["prompt"] * 6 + ["cancel", "ping", "response"]),
                               json_values)),
        "msg_id": draw(st.one_of(st.builds(_qid), texts, json_values)),
        "sender_session": draw(field("01J9Z8Y7X6W5V4T3S2R1Q0P9NM")),
        "sender_endpoint": draw(field("/nonexistent/asker.sock")),
        "hops": draw(field(0)),
        "timestamp": draw(field("2026-11-30T12:00:00.000Z")),
        "prompt": draw(field("Ship it?")),
        "sender_name": draw(field("fuzzer")),
        "sender_cwd": draw(field("/work")),
        "conversation_id": draw(field(None)),
        "response_schema": draw(field(None)),
        "reply_timeout_ms": draw(field(None)),
        "from": draw(field("fuzzer")),
        "to": draw(field("user-remote")),
        "created_at": draw(field("2026-11-30T12:00:00.000Z")),
        "ref_msg_id": draw(field("01ARZ3NDEKTSV4RRFFQ69G5FAV")),
    }
    return {k: v for k, v in body.items() if v is not MISSING}


def encode(value: Any, ascii_only: bool) -> bytes:
    """As a peer would put it on the wire; a non-ASCII lone surrogate becomes bytes
    that are not UTF-8 at all (what a careless encoder writes)."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass") + b"\n"


raw_lines = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ") + b"\n"),
    st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n + b"\n"),  # deep nesting
    st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n + b"\n"),
    st.sampled_from([b"1" + b"0" * 5000 + b"\n", b'{"type":"prompt","hops":1e999}\n',
                     b"NaN\n", b'{"type":"prompt","hops":NaN}\n', b"\x00\n", b"\n\n\n"]),
)
lines = st.one_of(st.builds(encode, envelopes(), st.booleans()), raw_lines)

POISON = (
    b'{"type":"prompt","msg_id":"x\\ud800y","sender_session":"s","sender_endpoint":'
    b'"/nonexistent/a.sock","hops":0,"timestamp":"t","prompt":"p","sender_name":"n",'
    b'"sender_cwd":"/"}\n'
)


def exchange(endpoint: str, line: bytes) -> list[bytes]:
    """Write one line, then read every reply line until the bridge closes (W12)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(endpoint)
        s.sendall(line)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            assert len(data) < 1 << 20
    return data.splitlines()


def still_answers(tree: Tree) -> None:
    """The property's second half: an ordinary question is acked and answered."""
    qid = tree.ask("still there?")
    tree.answer(qid, " fine ")
    env = tree.asker.response_for(qid)
    assert (env["response"], env["error"]) == ({"kind": "freeform", "text": "fine"}, None)


def test_every_line_gets_one_reply_in_our_words_and_the_bridge_keeps_answering() -> None:
    # X12, W12, W13, W14, C3
    with running_tree() as tree:

        @given(lines)
        @example(POISON)
        @example(POISON.replace(b'"sender_name":"n"', b'"sender_name":"\\udc00"'))
        def prop(line: bytes) -> None:
            replies = exchange(tree.endpoint, line)
            if not line.strip():
                assert replies == []  # nothing asked, nothing answered (W12)
            else:
                assert len(replies) == 1, replies
                reply = json.loads(replies[0])
                assert reply["type"] in ("ack", "nack", "pong"), reply
                if reply["type"] == "nack":
                    assert OUR_WORDS.fullmatch(reply["error"]), reply["error"]
            still_answers(tree)

        prop()
        assert tree.fatal == []


@st.composite
def answer_files(draw: st.DrawFn, qid: str) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.binary(max_size=80), raw_lines))
    body = {
        "qid": draw(st.one_of(st.just(qid), st.just(qid), st.builds(_qid), texts, json_values)),
        "answer": draw(field(" yes ")),
        "answered_by": draw(field("telegram:alice")),
        "at": draw(field("2026-11-30T12:01:00.000Z")),
        "extra": draw(field(None)),
    }
    body = {k: v for k, v in body.items() if v is not MISSING}
    return encode(body, draw(st.booleans()))


def test_every_answer_file_is_judged_as_c9_says_and_the_question_stays_answerable() -> None:
    # X12, C8, C9, C10, C11
    with running_tree() as tree:

        @given(st.data())
        def prop(data: st.DataObject) -> None:
            qid = tree.ask("which one?")
            name = f"{qid}.answer.json"
            content = data.draw(answer_files(qid))
            expected = validate_answer(name, content, {qid})  # the pure rule is the oracle
            tree.drop(name, content)
            if isinstance(expected, Accepted):
                env = tree.asker.response_for(qid)
                assert env["response"] == map_answer(expected.answer.answer, ()).json_body()
                return
            if expected.reason != "invalid_json":  # a half-written file waits (C10): overwrite
                record = wait_for(lambda: next(
                    (r for r in tree.log_records()
                     if r["event"] == "answer_rejected" and r["qid"] == qid), None),
                    what=f"answer_rejected for {qid}")
                detail = {"reason": expected.reason, "file": name}
                if expected.error is not None:
                    detail["error"] = expected.error
                assert record["detail"] == detail
            tree.answer(qid, " fine ")
            env = tree.asker.response_for(qid)
            assert env["response"] == {"kind": "freeform", "text": "fine"}

        prop()
        assert tree.fatal == []
