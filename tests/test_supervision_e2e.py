"""Supervision and hardening through the real daemon."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import time
from collections.abc import Iterator

import pytest

from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.contract import cancel_note
from tests.bridge_process import Bridge, new_qid, request
from tests.fakes import wait_for


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    yield b
    b.close()


def test_max_open_refuses_the_fourth_prompt_and_keeps_the_three(bridge: Bridge) -> None:
    # nacked at once with the count, nothing stored, the others answered
    bridge.start("--max-open", "3")
    qids = [bridge.ask(f"question {n}?") for n in range(3)]
    fourth = bridge.asker.prompt_envelope("one too many?")
    reply = request(bridge.endpoint, fourth)
    assert reply == {
        "type": "nack", "msg_id": fourth["msg_id"],
        "error": "bridge has 3 open questions; try again later",
    }
    assert bridge.ping()["agent_card"]["queue_depth"] == 3
    # each sent (before its answer: a question over before its turn is not sent)
    wait_for(lambda: len(bridge.sent_texts()) == 3, what="the three sent")
    for qid in qids:
        bridge.answer(qid, f"answer to {qid}")
    answered = {}
    for _ in qids:
        env = bridge.asker.response()
        answered[env["msg_id"]] = env["response"]
    assert answered == {q: {"kind": "freeform", "text": f"answer to {q}"} for q in qids}
    assert bridge.events(fourth["msg_id"]) == []  # nothing stored, nothing logged
    wait_for(lambda: len(bridge.sent_texts()) == 3, what="the three sent")
    assert not any("one too many?" in text for text in bridge.sent_texts())
    bridge.ask("room again?")  # closed questions make room


def test_a_note_owed_at_sigkill_is_sent_after_restart(bridge: Bridge) -> None:
    # the cancel note is stored with the cancel; hermes is still sending it when the
    # daemon is killed; the next start waits for that run and takes its outcome: the note
    # is sent, once
    bridge.start()
    qid = bridge.ask("Cancel me?")
    bridge.wait_log("delivered", qid)
    bridge.hermes.configure(sleep=1.5)
    bridge.cancel(qid)
    bridge.hermes.wait_started(2)
    assert bridge.proc is not None
    bridge.proc.send_signal(signal.SIGKILL)
    bridge.proc.wait(timeout=5)
    bridge.hermes.configure(sleep=0)
    bridge.start()
    note = cancel_note(qid)
    wait_for(lambda: note in bridge.sent_texts(), what="the owed note sent after restart")
    # hermes ran it: it is owed no more, so a second restart does not send it again
    path = bridge.state_path()

    def owed_notes() -> int:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return int(db.execute("SELECT COUNT(*) FROM notes").fetchone()[0])

    wait_for(lambda: owed_notes() == 0, what="the note recorded as sent")
    assert bridge.signal(signal.SIGTERM) == 0
    bridge.start()
    assert bridge.ping()["agent_card"]["queue_depth"] == 0
    time.sleep(0.3)  # the killed run's orphan hermes may still finish later; ours must not run
    assert sum(1 for t in bridge.sent_texts() if t == note) == 1


def test_a_row_nested_100000_deep_does_not_block_the_start(bridge: Bridge) -> None:
    # a row too deep for the decoder is dropped (one stderr line); the
    # rest lives
    store = Store.open(bridge.state_path())
    store.shutdown()
    deep = "[" * 100_000 + "]" * 100_000
    bad, good = new_qid(), new_qid()
    prompt = bridge.asker.prompt_envelope("Still restored?", good)

    with contextlib.closing(sqlite3.connect(bridge.state_path())) as db:
        db.execute(
            "INSERT INTO open_questions (qid, prompt, parsed, timeout_ms, deadline, state,"
            " owner) VALUES (?, ?, ?, 60000, ?, 'delivered', 'old')",
            (bad, deep, deep, time.time() + 60),
        )
        db.execute(
            "INSERT INTO open_questions (qid, prompt, parsed, timeout_ms, deadline, state,"
            " owner) VALUES (?, ?, ?, 60000, ?, 'delivered', 'old')",
            (good, json.dumps(prompt), json.dumps({"question": "Still restored?"}),
             time.time() + 60),
        )
        db.commit()
    bridge.start()
    assert bridge.ping()["agent_card"]["queue_depth"] == 1
    dropped = [line for line in bridge.stderr_lines if f"dropped open question {bad!r}" in line]
    assert len(dropped) == 1
    assert dropped[0].endswith("ValueError('JSON nested too deep')")
    bridge.answer(good, "yes")
    env = bridge.asker.response()
    assert env["msg_id"] == good and env["response"] == {"kind": "freeform", "text": "yes"}
