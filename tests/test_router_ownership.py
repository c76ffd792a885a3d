"""The Router applies the ownership rules, the asker's timeout and the project line (X2, X4, X5).

The Router runs for real with a real store; its collaborators are FakeRefs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    AnswerFileSeen,
    CancelQuestion,
    CancelRequested,
    FileSignature,
    LogEvent,
    OfferAgain,
    QuestionClosed,
    QuestionRestarted,
    SendText,
    StartQuestion,
)
from coms_hermes_bridge.messages.wire import CancelEnvelope
from tests.fakes import RouterRig, prompt_envelope, wait_for

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[RouterRig]:
    store = Store.open(tmp_path / "state-shop.sqlite3")
    r = RouterRig(store, timeout_ms=1_800_000, project="shop", run_tag="t", resume_owed=True, now=lambda: NOW,
                  clock=lambda: 1000.0)
    yield r
    r.ref.stop()
    store.shutdown()


def cancel(sender: str) -> CancelEnvelope:
    return CancelEnvelope.model_validate({
        "msg_id": "c1", "from": sender, "to": "user-remote",
        "created_at": "2026-11-30T12:00:00Z", "ref_msg_id": QID,
    })


def test_question_gets_the_askers_timeout_and_the_project_line(rig: RouterRig) -> None:
    # X5, X4
    assert rig.admit(prompt_envelope(QID, sender_name="agent-a", reply_timeout_ms=400)) is None
    start = rig.questions.expect(StartQuestion)
    assert (start.spec.timeout_ms, start.spec.deadline) == (400, 1000.4)
    assert rig.store.open_spec(QID, start.child).timeout_ms == 400  # type: ignore[union-attr]
    text = rig.delivery.expect(SendText).text
    assert text.startswith(f"❓ [HUB-Q:{QID}] Ship?\n\n📁 Project: shop\n\nContext: From agent-a")


def test_resend_by_the_asker_changes_nothing_and_a_replay_is_refused(rig: RouterRig) -> None:
    # X2
    original = prompt_envelope(QID, sender_name="agent-a", sender_endpoint="/tmp/a.sock")
    assert rig.admit(original) is None
    start = rig.questions.expect(StartQuestion)
    rig.delivery.expect(SendText)
    assert rig.admit(original) is None  # acked
    for other in (prompt_envelope(QID, sender_name="agent-b", sender_endpoint="/tmp/b.sock"),
                  prompt_envelope(QID, text="Ship now?", sender_name="agent-a",
                                  sender_endpoint="/tmp/a.sock")):
        assert rig.admit(other) == f"qid {QID} is already in use"
        record = rig.logger.expect(LogEvent).record
        assert (record.event, record.qid) == ("duplicate_refused", QID)
        assert record.detail == {"from": other.sender_name, "reason": "open"}
    # the nacks are replied after their turns' tells: nothing started or sent again
    rig.questions.assert_nothing()
    rig.delivery.assert_nothing()
    assert rig.depth() == 1
    # once closed, the qid stays refused, even to its asker
    rig.ref.tell(QuestionClosed(QID, "answered", start.child))
    assert rig.depth() == 0  # read after the close, in turn
    assert rig.admit(original) == f"qid {QID} is already in use"
    assert rig.logger.expect(LogEvent).record.detail == {"from": "agent-a", "reason": "closed"}


def test_only_the_asker_cancels(rig: RouterRig) -> None:
    # X2, C13
    assert rig.admit(prompt_envelope(QID, sender_name="agent-a")) is None
    start = rig.questions.expect(StartQuestion)
    rig.ref.tell(CancelQuestion(cancel("evil")))
    record = rig.logger.expect(LogEvent).record
    assert (record.event, record.qid, record.detail) == ("cancel_refused", QID, {"from": "evil"})
    assert not any(isinstance(m, CancelRequested) for m in start.slot._held)
    rig.ref.tell(CancelQuestion(cancel("agent-a")))
    wait_for(lambda: any(isinstance(m, CancelRequested) for m in start.slot._held),
             what="the asker's cancel reaches the question")


def test_a_restarted_question_gets_its_answer_file_offered_again(rig: RouterRig) -> None:
    # the watcher hands a file on once; if the question handling it restarts,
    # the Router asks for it again instead of waiting for the watcher's re-offer
    assert rig.admit(prompt_envelope(QID)) is None
    start = rig.questions.expect(StartQuestion)
    name = f"{QID}.answer.json"
    content = json.dumps({"qid": QID, "answer": "yes", "answered_by": "telegram:a",
                          "at": "2026-11-30T12:00:00Z"}).encode()
    rig.ref.tell(AnswerFileSeen(name, content, FileSignature(1, len(content), 2)))
    rig.ref.tell(QuestionRestarted(QID, start.child))
    assert rig.watcher.expect(OfferAgain) == OfferAgain(name)
    rig.ref.tell(QuestionRestarted(QID, start.child))  # not answering any more: nothing
    rig.depth()
    rig.watcher.assert_nothing()
