"""The QuestionRouter: admission, ownership, routing, late notes, restore, and the
supervision of the questions it runs.

The Router runs for real on a real Store, its collaborators FakeRefs (`RouterRig`).
Its questions are FakeRefs too, except where a test is about their crashes: there
they are Recorders (`Crashing`), real actors that crash on demand and tell the Router
as any question does.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors.config import parse_config
from coms_hermes_bridge.actors.questions import NOTED_MEMORY, failed_error
from coms_hermes_bridge.actors.state_view import read_snapshot
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.actors.supervision import Slot
from coms_hermes_bridge.messages.commands import (
    Address,
    AnswerArrived,
    AnswerFileSeen,
    CancelQuestion,
    ChildFailed,
    DisposeAnswerFile,
    FileSignature,
    HermesRan,
    LogEvent,
    NewQuestion,
    QuestionClosed,
    QuestionSpec,
    QueueDepthQuery,
    RejectAnswerFile,
    SendResponse,
    SendText,
)
from coms_hermes_bridge.messages.contract import (
    INVALID_QID_ERROR,
    NOT_ADMITTED,
    Rejected,
    late_note,
    over_capacity,
    parse_prompt,
    undelivered_note,
)
from coms_hermes_bridge.messages.wire import AnswerFile, CancelEnvelope
from tests.fakes import (
    Boom,
    FakeClock,
    FakeRef,
    Hold,
    Recorder,
    RouterRig,
    actors_held,
    prompt_envelope,
    wait_for,
)

QIDS = [f"01HZY3K4M5N6P7Q8R9S0T1V2W{c}" for c in "0123456789"]
QID = QIDS[0]
PROMPT = prompt_envelope(QID, text="Ship it?")
SIG = FileSignature(7, 80, 1)
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

Make = Callable[..., RouterRig]


def answer_file(qid: str, text: str = "yes") -> bytes:
    return json.dumps(
        {"qid": qid, "answer": text, "answered_by": "telegram:1", "at": "2026-11-30T12:00:00Z"}
    ).encode()


def seen(qid: str, content: bytes | None = None,
         signature: FileSignature = SIG) -> AnswerFileSeen:
    """The Watcher's word of `qid`'s answer file (its content that of `answer_file`)."""
    return AnswerFileSeen(f"{qid}.answer.json",
                          answer_file(qid) if content is None else content, signature)


def cancel(ref_msg_id: str, sender: str = "builder", by_operator: bool = False
           ) -> CancelQuestion:
    return CancelQuestion(CancelEnvelope.model_validate({
        "msg_id": QIDS[9], "from": sender, "to": "user-remote",
        "created_at": "2026-11-30T12:00:00.000Z", "ref_msg_id": ref_msg_id,
    }), by_operator)


def slot_of(rig: RouterRig, qid: str) -> Slot:
    """The slot the Router reaches `qid`'s question through (read after a sync)."""
    return rig.actor.open[qid].slot


def _spec(qid: str) -> QuestionSpec:
    envelope = prompt_envelope(qid)
    return QuestionSpec(qid, envelope, parse_prompt(envelope), 1000.0, time.time() + 60)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """`make(path=..., config={...}, **options)`: a Router on the state file `path`
    (the same file again: the daemon restarted, or with `incarnation=1` the Router
    restarted), settings `config` (a 60 s timeout unless given), the rest its own."""
    stores: list[Store] = []

    def _make(path: str = "state-a.sqlite3", *, config: dict[str, Any] | None = None,
              **options: Any) -> RouterRig:
        store = Store.open(tmp_path / path)
        stores.append(store)
        return RouterRig(store, config={"timeout_ms": 60_000, **(config or {})}, **options)

    yield _make
    pykka.ActorRegistry.stop_all()
    for store in stores:
        store.shutdown()


def test_over_capacity() -> None:
    assert over_capacity(2, 3) is None
    assert over_capacity(3, 3) == "bridge has 3 open questions; try again later"
    assert over_capacity(4, 3) == "bridge has 4 open questions; try again later"


def test_the_error_a_poison_questions_asker_reads_is_kept_to_500_characters() -> None:
    prefix = "bridge failed on this question: "
    assert failed_error("e" * 500) == prefix + "e" * 500  # at the limit: whole
    assert failed_error("e" * 501) == prefix + "e" * 499 + "…"  # past it: 500 in all


# -- admission (C2, C3, X2, X4, X5, X10) ------------------------------------------


def test_a_prompt_is_stored_before_it_is_acked_then_run_and_delivered(make: Make) -> None:
    rig = make()
    assert rig.admit(prompt_envelope(QIDS[0])) is None  # the ack: stored by then,
    # committed: another connection reads it (promise 1)
    assert [s.qid for s in read_snapshot(rig.store.path).open] == [QIDS[0]]
    [(spec, child, _question)] = rig.started[QIDS[0]]
    assert spec.qid == QIDS[0] and child == f"question:{QIDS[0]}:t.0.1"
    assert rig.store.open_spec(QIDS[0], child) is not None  # owned by the child
    sent = rig.delivery.expect(SendText)
    assert (sent.qid, sent.purpose) == (QIDS[0], "question")
    assert rig.depth() == 1


def test_a_question_it_runs_itself_has_its_collaborators_and_settings(make: Make) -> None:
    # C19, X9, C11: a question the Router starts (no test's fake) logs its delivery to the
    # target, reminds through Delivery (remind_before), answers, and has its file removed
    rig = make(config={"target": "telegram:42", "remind_before_ms": 59_800},
               start_question=None)
    assert rig.admit(prompt_envelope(QID)) is None
    job = rig.delivery.expect(SendText)
    rig.ref.tell(HermesRan(job, None))
    while (record := rig.logger.expect(LogEvent).record).event != "delivered":
        pass
    assert record.detail == {"to": "telegram:42"}
    assert rig.delivery.expect(SendText).purpose == "remind_note"  # 0.2 s after the asking
    rig.ref.tell(seen(QID))
    assert rig.peer.expect(SendResponse).response == {"kind": "freeform", "text": "yes"}
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(f"{QID}.answer.json", SIG)


def test_a_question_gets_the_askers_timeout_and_the_project_line(make: Make) -> None:  # X5, X4
    rig = make(config={"project": "shop", "timeout_ms": 1_800_000}, clock=lambda: 1000.0)
    assert rig.admit(prompt_envelope(QID, sender_name="agent-a", reply_timeout_ms=400)) is None
    [(spec, child, _question)] = rig.started[QID]
    assert (spec.timeout_ms, spec.deadline) == (400, 1000.4)
    assert rig.store.open_spec(QID, child).timeout_ms == 400  # type: ignore[union-attr]
    text = rig.delivery.expect(SendText).text
    assert text.startswith(f"❓ [HUB-Q:{QID}] Ship?\n\n📁 Project: shop\n\nContext: From agent-a")


def test_a_question_for_a_group_names_the_bot_in_its_typed_form(make: Make) -> None:  # X14
    rig = make(config={"target": "telegram:-1001234567890:7"})
    assert rig.admit(prompt_envelope(QID)) is None
    assert rig.delivery.expect(SendText).text.endswith(
        f"\n\n↩ Reply to this message, or type: @<bot name> HUB-Q:{QID}: <answer>")


def test_a_timeout_past_2_to_the_31_ms_is_kept_whole(make: Make) -> None:  # X17, C16
    # Node fires a timer past 2^31-1 ms after 1 ms; here nothing cuts it short
    config = parse_config(["--timeout", "3e9"], {"HOME": "/home/op"})
    rig = make(config={"timeout_ms": config.timeout_ms}, clock=lambda: 1000.0)
    assert rig.admit(prompt_envelope(QID)) is None
    [(spec, child, _question)] = rig.started[QID]
    assert (spec.timeout_ms, spec.deadline) == (3_000_000_000, 3_001_000.0)
    assert rig.store.open_spec(QID, child).timeout_ms == 3_000_000_000  # type: ignore[union-attr]


def test_past_max_open_a_prompt_is_refused_and_nothing_is_stored(make: Make) -> None:
    # nacked at once with the count; the open ones are untouched
    rig = make(config={"max_open": 3})
    for qid in QIDS[:3]:
        rig.opened(prompt_envelope(qid))
    assert rig.admit(prompt_envelope(QIDS[3])) == "bridge has 3 open questions; try again later"
    assert [s.qid for s in rig.store.load()[0]] == QIDS[:3]
    assert list(rig.started) == QIDS[:3]  # the nack is replied after the turn's tells
    assert rig.depth() == 3
    assert rig.ref.is_alive()
    # its own asker's resend of an open question is acked, not refused (X2), nor run again
    assert rig.admit(prompt_envelope(QIDS[0])) is None
    assert [len(starts) for starts in rig.started.values()] == [1, 1, 1]


def test_a_resend_by_the_asker_changes_nothing_and_a_replay_is_refused(make: Make) -> None:  # X2
    rig = make()
    original = prompt_envelope(QID, sender_name="agent-a", sender_endpoint="/tmp/a.sock")
    _spec, child, _question = rig.opened(original)
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
    assert len(rig.started[QID]) == 1
    rig.delivery.assert_nothing()
    assert rig.depth() == 1
    # once closed, the qid stays refused, even to its asker
    rig.close(QID, "answered", child)
    assert rig.depth() == 0  # read after the close, in turn
    assert rig.admit(original) == f"qid {QID} is already in use"
    assert rig.logger.expect(LogEvent).record.detail == {"from": "agent-a", "reason": "closed"}


def test_one_asker_past_its_limit_is_refused_and_others_are_not(make: Make) -> None:  # X10
    rig = make(config={"max_open_per_asker": 2})
    rig.opened(prompt_envelope(QIDS[0]))
    _spec, second, _question = rig.opened(prompt_envelope(QIDS[1]))
    assert rig.admit(prompt_envelope(QIDS[2])) == "builder has 2 open questions; try again later"
    assert [spec.qid for spec in rig.store.load()[0]] == QIDS[:2]  # nothing stored
    assert rig.admit(prompt_envelope(QIDS[3], sender_name="reviewer")) is None
    assert list(rig.started) == [QIDS[0], QIDS[1], QIDS[3]]
    assert rig.admit(prompt_envelope(QIDS[1])) is None  # its own resend: acked (X2)
    rig.close(QIDS[1], "answered", second)
    assert rig.admit(prompt_envelope(QIDS[4])) is None  # room again once one closed
    assert list(rig.started) == [QIDS[0], QIDS[1], QIDS[3], QIDS[4]]


def test_an_invalid_qid_is_answered_with_an_error_and_not_stored(make: Make) -> None:  # C3
    rig = make()
    bad = prompt_envelope("not-a-ulid")
    assert rig.admit(bad) is None
    assert rig.peer.expect(SendResponse) == SendResponse(bad, None, INVALID_QID_ERROR)
    assert rig.store.load() == ([], [])
    assert rig.started == {}


def test_a_store_that_cannot_take_a_question_is_nacked_in_our_words_and_said(
    make: Make, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # never a crash: the table is fine, the asker may try again
    rig = make()

    def full(*args: Any, **kwargs: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(rig.store, "put_open", full)
    capsys.readouterr()
    assert rig.admit(prompt_envelope(QIDS[0])) == NOT_ADMITTED
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: error: could not take question {QIDS[0]!r}: "
        "OperationalError('database or disk is full')\n")
    assert rig.ref.is_alive() and rig.depth() == 0


def test_a_question_its_listener_withdrew_is_neither_stored_nor_asked(make: Make) -> None:  # W14
    rig = make()
    withdrawn: concurrent.futures.Future[str | None] = concurrent.futures.Future()
    assert withdrawn.cancel()  # the asker was nacked "try again" before the Router got to it
    rig.ref.tell(NewQuestion(prompt_envelope(QIDS[0]), withdrawn))
    assert rig.depth() == 0  # a sync: handled in turn, after it
    assert rig.store.load() == ([], [])
    assert QIDS[0] not in rig.started
    rig.delivery.assert_nothing()
    assert rig.admit(prompt_envelope(QIDS[0])) is None  # the asker's try again is taken
    assert [spec.qid for spec in rig.store.load()[0]] == [QIDS[0]]


# -- cancel and close (C12-C14, X2) ---------------------------------------------------


def test_only_the_asker_cancels_and_only_an_open_question(make: Make) -> None:  # X2, C13, C14
    rig = make()
    _spec, _child, question = rig.opened(prompt_envelope(QID, sender_name="agent-a"))
    rig.ref.tell(cancel(QIDS[1], "agent-a"))  # not open here: nothing
    rig.ref.tell(cancel(QID, "evil"))
    record = rig.logger.expect(LogEvent).record
    assert (record.event, record.qid, record.detail) == ("cancel_refused", QID, {"from": "evil"})
    rig.depth()
    question.assert_nothing()
    rig.ref.tell(cancel(QID, "agent-a"))
    assert question.next() == cancel(QID, "agent-a")  # the same message, passed on
    rig.depth()
    question.assert_nothing()
    rig.logger.assert_nothing()


def test_a_closed_question_leaves_the_table_and_only_its_own_child_closes_it(
    make: Make,
) -> None:
    rig = make()
    _spec, child, question = rig.opened(prompt_envelope(QIDS[0]))
    slot = rig.actor.open[QIDS[0]].slot
    rig.ref.tell(QuestionClosed(QIDS[0], "question:someone-else", None))
    assert rig.depth() == 1
    rig.close(QIDS[0], "answered", child)
    assert rig.depth() == 0
    question.assert_nothing()  # a closed question stops itself: the Router does not again
    slot.tell(cancel(QID))
    question.assert_nothing()  # its slot is retired: nothing reaches it any more


def test_the_closed_qids_remembered_are_the_stores_and_no_others(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:  # X2, bounded: a qid the store still has is refused, one it let go is new again
    monkeypatch.setattr("coms_hermes_bridge.actors.store.CLOSED_MEMORY", 2)
    rig = make()
    for qid in QIDS[:3]:
        _spec, child, _question = rig.opened(prompt_envelope(qid))
        rig.close(qid, "answered", child)
    assert rig.depth() == 0
    assert rig.admit(prompt_envelope(QIDS[1])) == f"qid {QIDS[1]} is already in use"
    assert rig.admit(prompt_envelope(QIDS[0])) is None  # let go: a new question
    assert [spec.qid for spec in rig.store.load()[0]] == [QIDS[0]]


# -- answers (C9, C15, X6, X11) -------------------------------------------------------


def test_an_answer_reaches_its_question_and_again_after_it_restarted(make: Make) -> None:
    # Watcher -> Router -> Question. A question that crashes may have lost the answer it
    # was handling: each restart tells it again the newest version routed to it (and its
    # send, still owed: Delivery sends it once). A sighting while one is handled goes on
    # too: the question, closed by then, drops it
    rig = make()
    _spec, child, question = rig.opened(prompt_envelope(QID))
    assert rig.delivery.expect(SendText).qid == QID
    name = f"{QID}.answer.json"
    rig.ref.tell(seen(QID))
    rig.ref.tell(seen(QID))
    rig.depth()  # both handled
    for _ in range(2):
        arrived = question.expect(AnswerArrived)
        assert (arrived.answer.answer, arrived.name, arrived.signature) == ("yes", name, SIG)
    question.assert_nothing()
    for _ in range(2):
        rig.ref.tell(ChildFailed(child, "RuntimeError: boom"))
        rig.depth()
        assert rig.question(QID).expect(AnswerArrived) == arrived
        assert rig.delivery.expect(SendText).qid == QID  # pending: its send told again
    rig.watcher.assert_nothing()
    assert [c for _spec, c, _q in rig.started[QID]] == [child] * 3  # restarted twice, same name
    rig.ref.tell(seen(QID))
    rig.depth()
    assert isinstance(rig.question(QID).next(), AnswerArrived)
    rig.watcher.assert_nothing()


@pytest.mark.parametrize("by_operator", [False, True])
def test_a_question_restarted_after_a_cancel_is_told_it_again(
    make: Make, by_operator: bool
) -> None:
    # C13, X15: the cancel died with the crashed question's mailbox; the Router's table
    # kept it, the operator's mark with it
    rig = make()
    _spec, child, question = rig.opened(prompt_envelope(QID))
    rig.store.set_state(QID, "delivered", owner=child)
    rig.ref.tell(cancel(QID, by_operator=by_operator))
    assert question.expect(CancelQuestion) == cancel(QID, by_operator=by_operator)
    rig.ref.tell(ChildFailed(child, "RuntimeError: boom"))
    rig.depth()
    assert rig.question(QID).expect(CancelQuestion) == cancel(QID, by_operator=by_operator)
    rig.question(QID).assert_nothing()
    assert rig.delivery.expect(SendText).qid == QID  # at admission; delivered since: not again
    rig.delivery.assert_nothing()


def test_a_sends_result_goes_to_its_question_while_it_is_open(make: Make) -> None:
    # Delivery -> Router -> Question: one address for every question's result
    rig = make()
    _spec, child, question = rig.opened(prompt_envelope(QID))
    job = rig.delivery.expect(SendText)
    rig.ref.tell(HermesRan(job, None))
    rig.depth()
    assert question.expect(HermesRan) == HermesRan(job, None)
    rig.close(QID, "cancelled", child)
    rig.ref.tell(HermesRan(job, None))  # its question closed meanwhile: nobody to tell
    assert rig.depth() == 0
    question.assert_nothing()


def test_a_router_that_dies_with_a_prompt_unread_nacks_it_for_a_retry(make: Make) -> None:
    # promise 1: the asker is not left waiting out the admission timeout; it tries again
    rig = make()
    rig.depth()
    verdict: concurrent.futures.Future[str | None] = concurrent.futures.Future()
    answered: list[int] = []
    with actors_held():  # all in the mailbox before the first is read
        rig.ref.tell(("no", "such"))  # crashes it
        rig.ref.tell(NewQuestion(prompt_envelope(QID), verdict))
        rig.ref.tell(QueueDepthQuery(answered.append))
    assert verdict.result(5) == "bridge is restarting; try again"
    assert answered == [0]  # the open count it had
    rig.supervisor.expect(ChildFailed)
    assert rig.store.load()[0] == []


def test_a_file_whose_name_or_content_is_no_answer_is_refused(make: Make) -> None:  # C9
    # the name alone decides where it can; the version refused is the one seen
    rig = make()
    rig.opened(prompt_envelope(QIDS[0]))
    rig.ref.tell(AnswerFileSeen("notes.txt", b"{}", SIG))
    assert rig.watcher.expect(RejectAnswerFile) == RejectAnswerFile(
        "notes.txt", SIG, Rejected("invalid_path"))
    rig.ref.tell(seen(QIDS[1], b"{not json"))  # a foreign qid: never read
    assert rig.watcher.expect(RejectAnswerFile) == RejectAnswerFile(
        f"{QIDS[1]}.answer.json", SIG, Rejected("foreign_qid", QIDS[1]))
    rig.ref.tell(seen(QIDS[0], answer_file(QIDS[1])))  # an open one's, with another qid inside
    assert rig.watcher.expect(RejectAnswerFile) == RejectAnswerFile(
        f"{QIDS[0]}.answer.json", SIG, Rejected("qid_mismatch", QIDS[0]))


def _late_notes(rig: RouterRig, count: int) -> list[SendText]:
    notes: list[SendText] = []
    while len(notes) < count:
        note = rig.delivery.expect(SendText)
        if note.purpose == "late_note":
            notes.append(note)
    return notes


def _late_records(rig: RouterRig, count: int) -> list[Any]:
    records: list[Any] = []
    while len(records) < count:
        record = rig.logger.expect(LogEvent).record
        if record.event == "late_answer":
            records.append(record)
    return records


def test_a_late_answer_owes_its_note_when_judged(make: Make) -> None:
    # C15: the note is in the store before Delivery is told; the file is to go (the
    # Watcher then never offers that version again: one note per version)
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QIDS[0]))
    rig.close(QIDS[0], "cancelled", child)
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(seen(QIDS[0]))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(name, SIG)
    record = rig.logger.expect(LogEvent).record
    assert (record.event, record.detail) == ("late_answer", {"state": "cancelled"})
    [note] = _late_notes(rig, 1)
    assert note.text == late_note(QIDS[0]) and note.note_id is not None
    assert rig.store.owed_notes() == [note]
    rig.depth()
    rig.delivery.assert_nothing()
    rig.logger.assert_nothing()


def test_a_late_file_handed_on_again_by_a_restarted_watcher_gets_one_note(make: Make) -> None:
    # C15: a Watcher that crashed before removing it forgot it had handed it on, and
    # hands it on again; the human is told of that late answer once
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QIDS[0]))
    rig.close(QIDS[0], "cancelled", child)
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(seen(QIDS[0]))
    rig.ref.tell(seen(QIDS[0]))
    assert [rig.watcher.expect(DisposeAnswerFile) for _ in range(2)] == [
        DisposeAnswerFile(name, SIG)] * 2
    [note] = _late_notes(rig, 1)
    assert _late_records(rig, 1)[0].qid == QIDS[0]
    assert rig.store.owed_notes() == [note]
    rig.depth()
    rig.delivery.assert_nothing()
    rig.logger.assert_nothing()


def test_the_router_remembers_the_newest_noted_versions_up_to_its_bound(make: Make) -> None:
    # C15: a version handed on again is only removed while the Router remembers noting it:
    # the newest NOTED_MEMORY versions (bounded everywhere); an older one is noted afresh
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QID))
    rig.close(QID, "cancelled", child)
    versions = [FileSignature(SIG.inode, SIG.size, n) for n in range(NOTED_MEMORY + 1)]
    for version in versions:
        rig.ref.tell(seen(QID, signature=version))
    assert len(_late_notes(rig, NOTED_MEMORY + 1)) == NOTED_MEMORY + 1
    rig.depth()
    rig.delivery.assert_nothing()
    for version in (versions[1], versions[-1]):  # the oldest and the newest remembered
        rig.ref.tell(seen(QID, signature=version))
    rig.depth()
    rig.delivery.assert_nothing()
    rig.ref.tell(seen(QID, signature=versions[0]))  # forgotten: noted again
    assert len(_late_notes(rig, 1)) == 1


def test_each_late_file_gets_its_own_note_and_log_line(make: Make) -> None:
    # C15, C20: two closed questions, one late file each: two notes, two lines naming them
    rig = make()
    for qid, state in ((QIDS[0], "cancelled"), (QIDS[1], "timeout")):
        _spec, child, _question = rig.opened(prompt_envelope(qid))
        rig.close(qid, state, child)  # type: ignore[arg-type]
    for qid in QIDS[:2]:
        rig.ref.tell(seen(qid))
    assert [rig.watcher.expect(DisposeAnswerFile) for _ in range(2)] == [
        DisposeAnswerFile(f"{QIDS[0]}.answer.json", SIG),
        DisposeAnswerFile(f"{QIDS[1]}.answer.json", SIG),
    ]
    assert [(r.qid, r.detail) for r in _late_records(rig, 2)] == [
        (QIDS[0], {"state": "cancelled"}),
        (QIDS[1], {"state": "timeout"}),
    ]
    assert [n.text for n in _late_notes(rig, 2)] == [late_note(QIDS[0]), late_note(QIDS[1])]


def test_the_file_that_answered_a_question_is_not_late_after_a_restart(make: Make) -> None:
    # a crash between storing the answer and removing its file
    first = make()
    first.depth()  # its start has read the store: the rows below are not restored by it
    envelope = prompt_envelope(QIDS[0])
    spec = QuestionSpec(QIDS[0], envelope, parse_prompt(envelope), 1, time.time())
    first.store.put_open(spec, owner="q")
    first.store.close(QIDS[0], "answered", owner="q",
                      answer_file=(f"{QIDS[0]}.answer.json", SIG))
    first.ref.stop()
    rig = make()
    rig.ref.tell(seen(QIDS[0]))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(f"{QIDS[0]}.answer.json", SIG)
    rig.depth()  # that turn is over
    rig.logger.assert_nothing()


def test_the_file_that_answered_is_not_late_before_the_watcher_removed_it(make: Make) -> None:
    # a rescan re-offering the answering file between the close and its removal logs no
    # late_answer and sends the human no late note
    rig = make()
    _spec, child, question = rig.opened(prompt_envelope(QIDS[0]))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(seen(QIDS[0]))
    assert isinstance(question.next(), AnswerArrived)
    # the question closes its row with the file that answered, then says so
    rig.close(QIDS[0], "answered", child, answer_file=(name, SIG))
    rig.ref.tell(seen(QIDS[0]))  # offered again
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(name, SIG)
    rig.depth()  # that turn is over
    rig.logger.assert_nothing()
    assert rig.store.owed_notes() == []
    # another version of the file after the close is late, as before (C15)
    other = FileSignature(SIG.inode, SIG.size + 1, SIG.mtime_ns)
    rig.ref.tell(seen(QIDS[0], signature=other))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(name, other)
    assert rig.logger.expect(LogEvent).record.event == "late_answer"


def _settled(rig: RouterRig) -> None:
    """Nothing more is told or owed than the test has read, once the Router's turns are done."""
    rig.depth()
    for fake in (rig.watcher, rig.logger, rig.delivery, rig.peer):
        fake.assert_nothing()


@pytest.mark.parametrize("state", ["cancelled", "timeout"])
def test_an_answer_routed_to_a_question_that_closed_before_taking_it_is_late_at_once(
    make: Make, state: str
) -> None:
    # C15: the cancel (or the timer) and the answer crossed: the Router routed the file
    # to a question that closed before reading it, and the question dropped it. Once the
    # Router hears of the close, the version is judged late from that event: its note
    # owed and sent, the file to go, the line logged; once, though it was seen twice
    rig = make()
    _spec, child, question = rig.opened(prompt_envelope(QID))
    rig.delivery.expect(SendText)  # the question itself
    name = f"{QID}.answer.json"
    rig.ref.tell(seen(QID))
    rig.ref.tell(seen(QID))  # the same version again (a second event for it)
    rig.depth()
    assert [type(question.next()) for _ in range(2)] == [AnswerArrived, AnswerArrived]
    _settled(rig)  # routed, not judged: the question may yet take it
    rig.close(QID, state, child)  # type: ignore[arg-type]
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(name, SIG)
    record = rig.logger.expect(LogEvent).record
    assert (record.qid, record.event, record.detail) == (QID, "late_answer", {"state": state})
    [note] = _late_notes(rig, 1)
    assert note.text == late_note(QID)
    assert rig.store.owed_notes() == [note]
    _settled(rig)
    assert rig.depth() == 0


def test_the_answer_that_closed_its_question_is_not_late_and_a_second_one_is(
    make: Make,
) -> None:
    # C11, C15: the file that answered is the question's to remove, and it is not late;
    # a second version routed behind it (the human answered twice) is
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QIDS[0]))
    _spec, other, _question = rig.opened(prompt_envelope(QIDS[1]))
    rig.delivery.expect(SendText)
    rig.delivery.expect(SendText)
    newer = FileSignature(SIG.inode + 1, SIG.size, SIG.mtime_ns + 1)
    first, second = f"{QIDS[0]}.answer.json", f"{QIDS[1]}.answer.json"
    rig.ref.tell(seen(QIDS[0]))
    rig.ref.tell(seen(QIDS[1]))
    rig.ref.tell(seen(QIDS[1], signature=newer))
    rig.close(QIDS[0], "answered", child, answer_file=(first, SIG))
    _settled(rig)  # the one that answered: nothing from the Router
    rig.close(QIDS[1], "answered", other, answer_file=(second, SIG))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(second, newer)
    record = rig.logger.expect(LogEvent).record
    assert (record.qid, record.event, record.detail) == (
        QIDS[1], "late_answer", {"state": "answered"})
    assert [n.qid for n in _late_notes(rig, 1)] == [QIDS[1]]
    _settled(rig)


def test_of_several_versions_routed_only_the_newest_is_judged_late(make: Make) -> None:
    # C15: every version has the one name, so only the newest can still be on disk: the
    # human who answered twice before the cancel hears of a late answer once, not twice
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QID))
    rig.delivery.expect(SendText)
    versions = [FileSignature(SIG.inode + n, SIG.size, SIG.mtime_ns) for n in range(9)]
    for version in versions:
        rig.ref.tell(seen(QID, signature=version))
    rig.close(QID, "cancelled", child)
    assert rig.watcher.expect(DisposeAnswerFile).signature == versions[-1]
    assert len(_late_notes(rig, 1)) == 1
    assert len(_late_records(rig, 1)) == 1
    _settled(rig)


def test_an_answer_routed_to_a_question_whose_delivery_failed_gets_the_human_a_note_at_once(
    make: Make,
) -> None:
    # X11: hermes failed as the answer came: not late (the question never was, C19), but
    # the human is told at once, as for any later file of it
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QID))
    rig.delivery.expect(SendText)
    rig.ref.tell(seen(QID))
    rig.close(QID, None, child, undelivered_at=time.time())
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(f"{QID}.answer.json", SIG)
    assert rig.logger.expect(LogEvent).record.detail == {
        "reason": "foreign_qid", "file": f"{QID}.answer.json", "delivery_failed": True}
    assert rig.delivery.expect(SendText).text == undelivered_note(QID)
    _settled(rig)


@pytest.mark.parametrize("how", ["open", "closed", "undelivered"])
def test_a_file_a_sibling_knows_is_left_for_it(make: Make, tmp_path: Path, how: str) -> None:
    # X6: another project's bridge beside ours owns the qid, up or down
    sibling = Store.open(tmp_path / "state-b.sqlite3")
    try:
        sibling.put_open(_spec(QIDS[1]), owner="q")
        if how != "open":
            sibling.close(QIDS[1], "answered" if how == "closed" else None, owner="q",
                          undelivered_at=time.time() if how == "undelivered" else None)
    finally:
        sibling.shutdown()  # down: its file still says what it owns
    rig = make()
    rig.ref.tell(seen(QIDS[1]))
    rig.depth()  # that turn is over: the file is left alone (a foreign one is disposed of)
    rig.watcher.assert_nothing()
    rig.logger.assert_nothing()


def test_a_siblings_undelivered_qid_past_the_hour_is_foreign(make: Make, tmp_path: Path) -> None:
    # X6, X11: a failed delivery is remembered for an hour only
    sibling = Store.open(tmp_path / "state-b.sqlite3")
    try:
        sibling.put_open(_spec(QIDS[1]), owner="q")
        sibling.close(QIDS[1], None, owner="q", undelivered_at=time.time() - 3601)
    finally:
        sibling.shutdown()
    rig = make()
    rig.ref.tell(seen(QIDS[1]))
    assert rig.watcher.expect(RejectAnswerFile).rejected == Rejected("foreign_qid", QIDS[1])


def test_an_answer_to_our_undelivered_question_gets_the_human_a_note(make: Make) -> None:
    # X11: hermes failed, yet the human answered: told, note owed, the file to go (the
    # Watcher then never offers that version again: one note per version)
    rig = make()
    _spec, child, _question = rig.opened(prompt_envelope(QIDS[0]))
    rig.close(QIDS[0], None, child, undelivered_at=time.time())
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(seen(QIDS[0]))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(name, SIG)
    record = rig.logger.expect(LogEvent).record
    assert (record.qid, record.event, record.detail) == (
        QIDS[0], "answer_rejected",
        {"reason": "foreign_qid", "file": name, "delivery_failed": True})
    note = rig.delivery.expect(SendText)
    while note.purpose != "undelivered_note":
        note = rig.delivery.expect(SendText)
    assert note.text == undelivered_note(QIDS[0]) and note.note_id is not None
    assert rig.store.owed_notes() == [note]
    rig.depth()
    rig.delivery.assert_nothing()
    rig.logger.assert_nothing()
    rig.watcher.assert_nothing()


def test_siblings_are_not_read_when_our_own_memory_decides(make: Make) -> None:  # X11, X6
    # reading other bridges' state files costs I/O on the actors' thread: only when needed
    asked: list[str] = []

    def sibling(qid: str) -> str:
        asked.append(qid)
        return "b"

    rig = make(sibling=sibling)
    _spec, child, _question = rig.opened(prompt_envelope(QIDS[0]))
    rig.close(QIDS[0], None, child, undelivered_at=time.time())
    rig.ref.tell(seen(QIDS[0]))
    assert rig.watcher.expect(DisposeAnswerFile).name == f"{QIDS[0]}.answer.json"  # X11's way
    rig.ref.tell(seen(QIDS[1]))
    rig.depth()
    rig.watcher.assert_nothing()  # the sibling's: left alone
    assert asked == [QIDS[1]]


# -- what a start restores, and what it says (C18) ------------------------------------


def test_a_start_restores_open_questions_and_asks_for_what_is_owed(make: Make) -> None:
    # pending questions are sent to Telegram again (Delivery sends each once); owed notes
    # are Delivery's own to send at its start
    first = make()
    first.opened(prompt_envelope(QIDS[0]))
    _spec, second, _question = first.opened(prompt_envelope(QIDS[1]))
    first.store.set_state(QIDS[1], "delivered", owner=second)
    note = SendText(QIDS[2], "ℹ note", "late_note", note_id="late:x")
    first.store.owe_note(note)
    first.ref.stop()
    rig = make()
    rig.depth()  # the restore (before the first message) is over
    assert list(rig.started) == QIDS[:2]
    starts = [rig.started[qid][0] for qid in QIDS[:2]]
    assert [spec.state for spec, _child, _q in starts] == [None, "delivered"]
    told = rig.delivery.expect(SendText)
    assert (told.qid, told.purpose) == (QIDS[0], "question")
    rig.delivery.assert_nothing()
    # the rows now belong to the new children
    assert rig.store.open_spec(QIDS[1], starts[1][1]) is not None


def test_a_restored_question_still_pending_is_sent_to_telegram_again(make: Make) -> None:
    # it may or may not have reached Telegram before the stop: at least once
    first = make()
    _spec, child, _question = first.opened(prompt_envelope(QIDS[0]))
    first.store.set_state(QIDS[0], "pending", owner=child)
    first.ref.stop()
    rig = make()
    sent = rig.delivery.expect(SendText)
    [(spec, _child, _q)] = rig.started[QIDS[0]]
    assert spec.state == "pending"
    assert (sent.qid, sent.purpose) == (QIDS[0], "question")


def test_a_start_leaves_owed_responses_to_the_peer_remembers_closed_states_and_says_so(
    make: Make, capsys: pytest.CaptureFixture[str]
) -> None:
    first = make()
    first.opened(prompt_envelope(QIDS[0]))
    _spec, closing, _question = first.opened(prompt_envelope(QIDS[1]))
    owed = SendResponse(prompt_envelope(QIDS[1]), None, "cancelled by the asker", closing)
    assert first.store.close(QIDS[1], "cancelled", owner=closing, response=owed)
    first.ref.stop()
    capsys.readouterr()
    rig = make()
    rig.depth()
    rig.peer.assert_nothing()  # owed by the last run: the Peer sends it as it starts
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: info: restored 1 open and 1 closed question(s)\n")
    rig.ref.tell(seen(QIDS[1]))
    record = _late_records(rig, 1)[0]
    assert (record.qid, record.detail) == (QIDS[1], {"state": "cancelled"})  # as it closed


@pytest.mark.parametrize("what", ["only closed", "nothing"])
def test_the_restore_line_counts_what_there_was_and_is_left_out_for_nothing(
    make: Make, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    first = make()
    if what == "only closed":
        _spec, child, _question = first.opened(prompt_envelope(QIDS[0]))
        first.store.close(QIDS[0], "answered", owner=child)
    first.ref.stop()
    capsys.readouterr()
    make().depth()
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: info: restored 0 open and 1 closed question(s)\n"
        if what == "only closed" else "")


def test_a_restarted_router_runs_its_questions_afresh(
    make: Make, capsys: pytest.CaptureFixture[str]
) -> None:
    # the Router crashed: its questions died with it and start again under new names
    # (the store's owner guard keeps a leftover from writing); the answers they were
    # handling come again from the Watcher's re-offer. It
    # restores without a line (the line is the daemon's start) and sends nothing owed
    # again (that is the first start's)
    first = make()
    _spec, old, _question = first.opened(prompt_envelope(QIDS[0]))
    first.opened(prompt_envelope(QIDS[1]))
    first.ref.tell(seen(QIDS[0]))
    first.depth()
    first.watcher.assert_nothing()
    first.store.owe_note(SendText(QIDS[2], "ℹ note", "late_note", note_id="late:x"))
    first.ref.stop()
    capsys.readouterr()
    again = make(incarnation=1)  # the same state file, as a restarted child
    again.depth()  # its begin() has run
    [(_spec, new, _question)] = again.started[QIDS[0]]
    assert new == f"question:{QIDS[0]}:t.1.1" and new != old
    assert again.store.open_spec(QIDS[0], old) is None  # the old name writes no more
    again.ref.tell(seen(QIDS[0]))  # the Watcher's re-offer
    again.depth()
    assert isinstance(again.question(QIDS[0]).next(), AnswerArrived)
    # both still pending: asked again, at least once; the owed note is not sent again
    assert [again.delivery.expect(SendText).qid for _ in range(2)] == QIDS[:2]
    again.delivery.assert_nothing()
    again.watcher.assert_nothing()
    assert capsys.readouterr().err == ""
    again.ref.stop()
    # a first start offers nothing: the Watcher's first deep rescan covers it
    fresh = make()
    fresh.depth()  # its start (the restore) is over
    fresh.watcher.assert_nothing()


def test_a_question_closed_between_the_restores_read_and_its_claim_stays_closed(
    make: Make, monkeypatch: pytest.MonkeyPatch,
) -> None:  # restart-safe both ways: a question that ended meanwhile is never asked again
    first = make()
    _spec, child, _question = first.opened(prompt_envelope(QIDS[0]))
    assert first.delivery.expect(SendText).qid == QIDS[0]  # asked once, at admission
    first.ref.stop()
    read = Store.load

    def load_then_close(store: Store) -> Any:
        rows = read(store)
        # the old question ends its row just after the Router read it, before the claim
        store.close(QIDS[0], "answered", owner=child)
        return rows

    monkeypatch.setattr(Store, "load", load_then_close)
    rig = make()
    assert rig.depth() == 0
    assert rig.started == {}  # not started again
    rig.delivery.assert_nothing()  # nor asked again
    monkeypatch.undo()
    assert rig.store.load()[0] == []


def test_an_unknown_message_names_the_router_and_the_message(make: Make) -> None:
    rig = make()
    rig.ref.tell(("no", "such"))
    assert rig.supervisor.expect(ChildFailed).error == (
        "UnknownMessage: router does not take tuple: ('no', 'such')")


# -- the questions' supervision: restart from the row, replay, bounds, poison (C19) ---


class _Relay:
    """A question's supervisor address: tells the Router, then records it in `reported`."""

    def __init__(self, to: Address, reported: FakeRef) -> None:
        self.to, self.reported = to, reported

    def tell(self, message: Any) -> None:
        self.to.tell(message)
        self.reported.tell(message)


class Crashing:
    """A Router whose questions are Recorders: each tells `seen` what it reads, tagged with
    its incarnation (0, 1, ... in start order), and crashes on Boom. Each start is
    recorded (`starts`: spec, name, slot, the Router's address it was wired with), or
    raises the next of `fails`; what the questions tell the Router is also in `reported`.
    The restart bound is 3 in 10 s on `clock`. QID is admitted and its row delivered: run
    as `child` behind `slot`."""

    def __init__(self, make: Make) -> None:
        self.seen, self.reported = FakeRef("seen"), FakeRef("reported")
        self.clock = FakeClock()
        self.starts: list[tuple[QuestionSpec, str, Slot, Address]] = []
        self.fails: list[Exception] = []
        self._incarnation = itertools.count()
        self.rig = make(start_question=self._start, question_restarts=3, window_s=10,
                        monotonic=self.clock, now=lambda: NOW)
        assert self.rig.admit(PROMPT) is None
        _spec, self.child, self.slot, _router = self.starts[0]
        assert self.rig.store.set_state(QID, "delivered", owner=self.child)

    def _start(self, spec: QuestionSpec, child: str) -> Any:
        # (in the Router's turn: its table already holds the slot it will bind)
        self.starts.append((spec, child, slot_of(self.rig, spec.qid), self.rig.me))
        if self.fails:
            raise self.fails.pop(0)
        return Recorder.start(supervisor=_Relay(self.rig.me, self.reported), seen=self.seen,
                              name=child, incarnation=next(self._incarnation))

    def crash(self, slot: Slot | None = None) -> None:
        """Crash a question (QID's unless `slot`) and wait until it runs again."""
        slot = slot or self.slot
        before = slot.ref
        slot.tell(Boom())
        self.restarted(before, slot)

    def let_be(self, starts: int, err: str) -> None:
        """Nothing was started again (`starts` in all), told or said (`err`: stderr)."""
        assert len(self.starts) == starts
        self.rig.peer.assert_nothing()
        self.rig.watcher.assert_nothing()
        self.seen.assert_nothing()
        assert err == ""

    def restarted(self, before: Any, slot: Slot | None = None) -> None:
        slot = slot or self.slot
        wait_for(lambda: slot.ref not in (None, before), what="the question restarted")


@pytest.fixture
def crashing(make: Make) -> Crashing:
    return Crashing(make)


def test_a_crashed_question_restarts_from_its_row_and_its_unread_mail_is_gone(
    crashing: Crashing, capsys: pytest.CaptureFixture[str]
) -> None:
    # the store row is the one record of its state; what it had not read is lost (what
    # mattered of it the Router tells again), and what comes later reaches the new
    # incarnation through the same slot
    c = crashing
    release = threading.Event()
    before = c.slot.ref
    for message in (Hold(release), Boom(), "m1", "m2", "m3"):
        c.slot.tell(message)
    release.set()
    c.restarted(before)
    c.slot.tell("m4")
    assert c.seen.next() == (1, "m4")
    assert [spec.state for spec, _child, _slot, _router in c.starts] == [None, "delivered"]
    assert [(child, slot is c.slot, router is c.rig.me)
            for _spec, child, slot, router in c.starts] == [(c.child, True, True)] * 2
    assert c.rig.depth() == 1
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: warning: {c.child} crashed (RuntimeError: boom); restarting it\n")


def test_a_question_that_crashes_mid_send_has_its_send_told_again(crashing: Crashing) -> None:
    # pending: the result of its send may have died with it; Delivery sends it once, or
    # settles it from the outcome the store kept
    c = crashing
    assert c.rig.store.set_state(QID, "pending", owner=c.child)
    assert c.rig.delivery.expect(SendText).qid == QID  # at admission
    c.crash()
    assert c.rig.delivery.expect(SendText).qid == QID
    assert c.starts[-1][0].state == "pending"


def test_a_poison_question_is_closed_with_an_error_and_the_rest_lives_on(
    crashing: Crashing, capsys: pytest.CaptureFixture[str]
) -> None:
    # past its bound the question is closed, its asker told, the event logged, the row
    # gone (not restored), the Router alive and the question's address retired
    c = crashing
    for _ in range(3):
        c.crash()
    capsys.readouterr()
    c.slot.tell(Boom())
    owed = c.rig.peer.expect(SendResponse)
    assert owed == SendResponse(
        PROMPT, None, "bridge failed on this question: RuntimeError: boom", c.child)
    record = c.rig.logger.expect(LogEvent).record
    assert (record.qid, record.event, record.detail) == (
        QID, "question_failed", {"error": "RuntimeError: boom"})
    assert record.at == "2026-11-30T12:00:00.000Z"
    assert c.rig.depth() == 0 and c.rig.store.closed(QID) is None  # no state it closed in (C19)
    policy = c.rig.actor.policy  # nothing of the question is kept once it is gone for good
    assert c.child not in policy._each
    assert capsys.readouterr().err == (
        f"coms-hermes-bridge: error: question {QID} crashed 4 times within 10s; "
        "closed it with an error (RuntimeError: boom)\n")
    assert c.rig.store.load() == ([], [])  # not restored on the next start
    assert c.rig.store.outbox() == [owed]  # owed until the Peer has handed it over
    assert len(c.starts) == 4
    c.slot.tell("dropped")
    assert c.slot.ref is None  # retired
    # the Router takes the next question as before
    assert c.rig.admit(prompt_envelope(QIDS[1])) is None and c.rig.depth() == 1


def test_an_answer_routed_to_a_poison_question_is_judged_as_it_closes(
    crashing: Crashing,
) -> None:
    # closed with no state (C19): its answer is a file no question of ours has, judged
    # at once as foreign (removed, logged by the Watcher), not left for the re-offer
    c = crashing
    c.rig.ref.tell(seen(QID))
    assert c.seen.next() == (0, AnswerArrived(AnswerFile.model_validate_json(answer_file(QID)),
                                              f"{QID}.answer.json", SIG))
    for n in range(3):
        c.crash()
        assert c.seen.next()[0] == n + 1  # the answer, told again to each incarnation
    c.slot.tell(Boom())
    c.rig.peer.expect(SendResponse)
    assert c.rig.watcher.expect(RejectAnswerFile) == RejectAnswerFile(
        f"{QID}.answer.json", SIG, Rejected("foreign_qid", QID))
    c.rig.depth()
    c.rig.watcher.assert_nothing()
    c.rig.delivery.expect(SendText)  # the question itself
    c.rig.delivery.assert_nothing()  # no late note: it was never answered, cancelled or timed out


def test_an_answer_routed_before_a_restart_is_late_once_the_question_closes(
    crashing: Crashing,
) -> None:
    # C15: the Router's memory of what it routed is the question's, not an incarnation's;
    # and a question that stored its close but crashed before saying so is judged the same
    c = crashing
    name = f"{QID}.answer.json"
    c.rig.ref.tell(seen(QID))
    assert c.seen.next()[0] == 0
    c.crash()
    c.rig.ref.tell(seen(QID))  # the Watcher's re-offer: the same version, routed again
    c.rig.store.close(QID, "cancelled", owner=c.child)  # its close, then a crash
    before = c.slot.ref
    c.slot.tell(Boom())
    wait_for(lambda: before is not None and not before.is_alive(), what="the question crashed")
    assert c.rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(name, SIG)
    record = c.rig.logger.expect(LogEvent).record
    assert (record.event, record.detail) == ("late_answer", {"state": "cancelled"})
    assert c.rig.depth() == 0
    assert len(c.starts) == 2  # not started again: nothing left to resume
    c.rig.watcher.assert_nothing()
    c.rig.logger.assert_nothing()
    assert [n.purpose for n in (c.rig.delivery.expect(SendText), c.rig.delivery.expect(SendText))
            ] == ["question", "late_note"]
    c.rig.delivery.assert_nothing()


def test_restarts_spread_over_time_are_not_poison(crashing: Crashing) -> None:
    c = crashing
    for _ in range(3):
        c.crash()
    c.clock.now += 10.5
    c.crash()
    c.rig.depth()
    c.rig.peer.assert_nothing()


def test_each_question_has_a_restart_bound_of_its_own(crashing: Crashing) -> None:
    # another question's crashes do not count toward this one's bound
    c = crashing
    assert c.rig.admit(prompt_envelope(QIDS[1])) is None
    other = c.starts[-1][2]
    for slot in (c.slot, other, c.slot, other, c.slot, other):  # 3 crashes each
        c.crash(slot)
    assert c.rig.depth() == 2
    c.rig.peer.assert_nothing()  # neither is poison: 3 crashes each, within each bound


def test_a_question_that_cannot_start_is_restarted_then_given_up_with_its_error(
    crashing: Crashing, capsys: pytest.CaptureFixture[str]
) -> None:
    # as if it had crashed at once: counted, and past its bound the asker is told why
    c = crashing
    capsys.readouterr()
    c.fails.extend(ValueError("bad spec") for _ in range(10))
    before = c.slot.ref
    c.slot.tell(Boom())
    owed = c.rig.peer.expect(SendResponse)
    assert owed == SendResponse(
        PROMPT, None, "bridge failed on this question: ValueError: bad spec", c.child)
    assert len(c.starts) == 1 + 3  # the first start, then three restarts, each failing
    assert before is not None and not before.is_alive()
    assert c.rig.depth() == 0
    assert capsys.readouterr().err.splitlines() == [
        f"coms-hermes-bridge: warning: {c.child} crashed (RuntimeError: boom); restarting it",
        f"coms-hermes-bridge: warning: {c.child} crashed (ValueError: bad spec); restarting it",
        f"coms-hermes-bridge: warning: {c.child} crashed (ValueError: bad spec); restarting it",
        f"coms-hermes-bridge: error: question {QID} crashed 4 times within 10s; "
        "closed it with an error (ValueError: bad spec)",
    ]


def test_a_poison_question_not_recorded_still_tells_its_asker(
    crashing: Crashing, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = crashing

    def close(*args: Any, **kwargs: Any) -> bool:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(c.rig.store, "close", close)
    c.fails.extend(ValueError("bad") for _ in range(10))
    c.slot.tell(Boom())
    assert c.rig.peer.expect(SendResponse) == SendResponse(
        PROMPT, None, "bridge failed on this question: ValueError: bad", c.child)
    record = c.rig.logger.expect(LogEvent).record
    assert (record.event, record.detail) == ("question_failed", {"error": "ValueError: bad"})
    assert c.rig.depth() == 0
    assert (f"coms-hermes-bridge: could not record question {QID} as failed: "
            "OperationalError('disk I/O error')\n") in capsys.readouterr().err


def test_a_question_whose_row_is_gone_is_not_restarted_and_takes_no_more_mail(
    crashing: Crashing,
) -> None:
    # replaced by a repeated qid meanwhile: nothing to resume
    c = crashing
    c.rig.store.put_open(c.starts[0][0], owner="question:someone-else")
    c.slot.tell(Boom())
    assert c.reported.expect(ChildFailed).child == c.child
    assert c.rig.depth() == 0 and c.rig.store.closed(QID) is None
    assert len(c.starts) == 1  # not started again
    c.slot.tell("late")
    assert c.slot.ref is None  # retired
    c.seen.assert_nothing()
    c.rig.peer.assert_nothing()


def test_word_from_a_question_it_no_longer_runs_changes_nothing(
    crashing: Crashing, capsys: pytest.CaptureFixture[str]
) -> None:
    # a question that crashed after it closed, the last words of one that is gone, and
    # anything from a name it never gave out: all let be
    c = crashing
    assert c.rig.admit(prompt_envelope(QIDS[1])) is None
    other = c.starts[-1][1]
    release = threading.Event()
    before = c.slot.ref
    assert before is not None
    c.slot.tell(Hold(release))
    c.slot.tell(Boom())
    c.rig.close(QID, "answered", c.child)
    assert c.rig.depth() == 1
    release.set()
    assert c.reported.expect(ChildFailed).child == c.child  # crashed after its close
    for message in (
        QuestionClosed(QID, c.child, None),
        ChildFailed(f"question:{QIDS[1]}:an-older-child", "RuntimeError: boom"),
        QuestionClosed(QIDS[1], f"question:{QIDS[1]}:an-older-child", None),
        ChildFailed(f"question:{QIDS[5]}:t.0.9", "RuntimeError: boom"),
        ChildFailed("no-question-at-all", "RuntimeError: boom"),
    ):
        c.rig.ref.tell(message)
    assert c.rig.depth() == 1
    assert c.rig.ref.is_alive() and c.rig.actor.open[QIDS[1]].child == other
    assert c.rig.store.closed(QID) == ("answered", None)
    c.let_be(starts=2, err=capsys.readouterr().err)


def test_a_stopping_router_stops_its_questions(crashing: Crashing) -> None:
    # they die with the table that runs them; a successor starts them again
    c = crashing
    question = c.slot.ref
    assert question is not None
    c.rig.ref.stop(timeout=5)
    wait_for(lambda: not question.is_alive(), what="the question stopped with it")
    c.slot.tell("dropped")
    assert c.slot.ref is None
