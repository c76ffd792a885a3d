"""The Router applies the ownership rules, the asker's timeout and the project line (X2, X4, X5).

The Router runs for real with a real store; its collaborators are FakeRefs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pykka
import pytest

from coms_hermes_bridge.actors.router import QuestionRouter
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    AnswerFileSeen,
    CancelQuestion,
    CancelRequested,
    FileSignature,
    LogEvent,
    NewQuestion,
    OfferAgain,
    QuestionClosed,
    QuestionRestarted,
    QueueDepthQuery,
    SendText,
    StartQuestion,
)
from coms_hermes_bridge.messages.wire import CancelEnvelope, PromptEnvelope
from tests.fakes import FakeRef, wait_for

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T = TypeVar("T")


def _replied(ref: pykka.ActorRef[Any], message: Callable[[Callable[[T], None]], object]) -> T:
    """Tell the Router `message(reply)` and wait (5 s) for the value it replies with,
    on its own turn."""
    got: list[T] = []
    done = threading.Event()

    def reply(value: T) -> None:
        got.append(value)
        done.set()

    ref.tell(message(reply))
    assert done.wait(5), "the router did not reply within 5 s"
    assert len(got) == 1
    return got[0]


def depth(ref: pykka.ActorRef[Any]) -> int:
    """QueueDepthQuery's reply; handled in turn, so also a sign all told before is read."""
    return _replied(ref, lambda reply: QueueDepthQuery(reply))


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.store = Store.open(tmp_path / "state-shop.sqlite3")
        self.fakes = {n: FakeRef(n) for n in
                      ("supervisor", "questions", "peer", "delivery", "watcher", "logger")}
        self.ref = QuestionRouter.start(
            **self.fakes, store=self.store, timeout_ms=1_800_000, project="shop",
            run_tag="t", now=lambda: NOW, clock=lambda: 1000.0,
        )

    def admit(self, prompt: PromptEnvelope) -> str | None:
        """NewQuestion's reply: None once it is stored (acked), else the nack's error."""
        return _replied(self.ref, lambda reply: NewQuestion(prompt, reply))

    def __getattr__(self, name: str) -> FakeRef:
        return self.fakes[name]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.ref.stop()
    r.store.shutdown()


def prompt(text: str = "Ship?", endpoint: str = "/tmp/a.sock", name: str = "agent-a",
           **fields: Any) -> PromptEnvelope:
    return PromptEnvelope.model_validate({
        "msg_id": QID, "sender_endpoint": endpoint, "hops": 0, "prompt": text,
        "sender_name": name, "sender_cwd": "/w", **fields,
    })


def cancel(sender: str) -> CancelEnvelope:
    return CancelEnvelope.model_validate({
        "msg_id": "c1", "from": sender, "to": "user-remote",
        "created_at": "2026-11-30T12:00:00Z", "ref_msg_id": QID,
    })


def test_question_gets_the_askers_timeout_and_the_project_line(rig: Rig) -> None:
    # X5, X4
    assert rig.admit(prompt(reply_timeout_ms=400)) is None
    start = rig.questions.expect(StartQuestion)
    assert (start.spec.timeout_ms, start.spec.deadline) == (400, 1000.4)
    assert rig.store.open_spec(QID, start.child).timeout_ms == 400  # type: ignore[union-attr]
    text = rig.delivery.expect(SendText).text
    assert text.startswith(f"❓ [HUB-Q:{QID}] Ship?\n\n📁 Project: shop\n\nContext: From agent-a")


def test_resend_by_the_asker_changes_nothing_and_a_replay_is_refused(rig: Rig) -> None:
    # X2
    original = prompt()
    assert rig.admit(original) is None
    start = rig.questions.expect(StartQuestion)
    rig.delivery.expect(SendText)
    assert rig.admit(original) is None  # acked
    for other in (prompt(endpoint="/tmp/b.sock", name="agent-b"), prompt("Ship now?")):
        assert rig.admit(other) == f"qid {QID} is already in use"
        record = rig.logger.expect(LogEvent).record
        assert (record.event, record.qid) == ("duplicate_refused", QID)
        assert record.detail == {"from": other.sender_name, "reason": "open"}
    rig.questions.quiet()
    rig.delivery.quiet()
    assert depth(rig.ref) == 1
    # once closed, the qid stays refused, even to its asker
    rig.ref.tell(QuestionClosed(QID, "answered", start.child))
    wait_for(lambda: depth(rig.ref) == 0, what="closed")
    assert rig.admit(original) == f"qid {QID} is already in use"
    assert rig.logger.expect(LogEvent).record.detail == {"from": "agent-a", "reason": "closed"}


def test_only_the_asker_cancels(rig: Rig) -> None:
    # X2, C13
    assert rig.admit(prompt()) is None
    start = rig.questions.expect(StartQuestion)
    rig.ref.tell(CancelQuestion(cancel("evil")))
    record = rig.logger.expect(LogEvent).record
    assert (record.event, record.qid, record.detail) == ("cancel_refused", QID, {"from": "evil"})
    assert not any(isinstance(m, CancelRequested) for m in start.slot._held)
    rig.ref.tell(CancelQuestion(cancel("agent-a")))
    wait_for(lambda: any(isinstance(m, CancelRequested) for m in start.slot._held),
             what="the asker's cancel reaches the question")


def test_a_restarted_question_gets_its_answer_file_offered_again(rig: Rig) -> None:  # issue 14.4
    # the watcher hands a file on once; if the question handling it restarts,
    # the Router asks for it again instead of waiting for the watcher's re-offer
    assert rig.admit(prompt()) is None
    start = rig.questions.expect(StartQuestion)
    name = f"{QID}.answer.json"
    content = json.dumps({"qid": QID, "answer": "yes", "answered_by": "telegram:a",
                          "at": "2026-11-30T12:00:00Z"}).encode()
    rig.ref.tell(AnswerFileSeen(name, content, FileSignature(1, len(content), 2)))
    rig.ref.tell(QuestionRestarted(QID, start.child))
    assert rig.watcher.expect(OfferAgain) == OfferAgain(name)
    rig.ref.tell(QuestionRestarted(QID, start.child))  # not answering any more: nothing
    depth(rig.ref)
    rig.watcher.quiet(0.1)
