"""QuestionRouter with fake collaborators: admission, routing, late notes, restore."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    AnswerArrived,
    AnswerFileSeen,
    CancelQuestion,
    CancelRequested,
    DisposeAnswerFile,
    FileSignature,
    LogEvent,
    OfferAgain,
    QuestionClosed,
    QuestionRestarted,
    QuestionSpec,
    RemoveAnswerFile,
    ResetQuestions,
    RestoreQuestions,
    SendResponse,
    SendText,
    StartQuestion,
)
from coms_hermes_bridge.messages.contract import (
    INVALID_QID_ERROR,
    NOT_ADMITTED,
    Answering,
    Late,
    OwnedElsewhere,
    Rejected,
    ToValidate,
    cancel_target,
    late_note,
    over_capacity,
    parse_prompt,
    triage_answer,
    undelivered_note,
)
from coms_hermes_bridge.messages.wire import CancelEnvelope
from tests.fakes import RouterRig, prompt_envelope

QIDS = [f"01HZY3K4M5N6P7Q8R9S0T1V2W{c}" for c in "0123456789"]
SIG = FileSignature(7, 80, 1)


def answer_file(qid: str, text: str = "yes") -> bytes:
    return json.dumps(
        {"qid": qid, "answer": text, "answered_by": "telegram:1", "at": "2026-11-30T12:00:00Z"}
    ).encode()


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    stores: list[Store] = []

    def _make(
        max_open: int = 10_000, resume_owed: bool = True, path: str = "state-a.sqlite3",
        max_open_per_asker: int | None = None, sibling: Any = None,
    ) -> RouterRig:
        store = Store.open(tmp_path / path)
        stores.append(store)
        rig = RouterRig(
            store, timeout_ms=60_000, run_tag="t.0", max_open=max_open, resume_owed=resume_owed,
            max_open_per_asker=max_open_per_asker, sibling=sibling,
        )
        assert rig.questions.expect(ResetQuestions) == ResetQuestions()
        return rig

    yield _make
    pykka.ActorRegistry.stop_all()
    for store in stores:
        store.shutdown()


# -- the pure decisions ----------------------------------------------------------


def test_triage_decides_from_the_name_alone() -> None:
    # late, foreign and "already answering" before any parsing
    a, b, c, d = QIDS[:4]
    answering = {a: False, b: True}
    closed = {c: "answered"}
    assert triage_answer(f"{a}.answer.json", answering, closed) == ToValidate(a)  # type: ignore[arg-type]
    assert triage_answer(f"{b}.answer.json", answering, closed) == Answering(b)  # type: ignore[arg-type]
    assert triage_answer(f"{c}.answer.json", answering, closed) == Late(c, "answered")  # type: ignore[arg-type]
    assert triage_answer(f"{d}.answer.json", answering, closed) == Rejected("foreign_qid", d)  # type: ignore[arg-type]
    assert triage_answer("x.answer.json", answering, closed) == Rejected("invalid_qid")  # type: ignore[arg-type]
    assert triage_answer(f"{a}.json", answering, closed) == Rejected("invalid_path")  # type: ignore[arg-type]


def test_over_capacity() -> None:
    assert over_capacity(2, 3) is None
    assert over_capacity(3, 3) == "bridge has 3 open questions; try again later"
    assert over_capacity(4, 3) == "bridge has 4 open questions; try again later"


def test_cancel_target() -> None:
    assert cancel_target(QIDS[0], {QIDS[0]}) == QIDS[0]
    assert cancel_target(QIDS[1], {QIDS[0]}) is None


# -- admission -----------------------------------------------------------------------


def test_a_prompt_is_stored_before_it_is_acked_then_run_and_delivered(make: Any) -> None:
    rig = make()
    assert rig.admit(prompt_envelope(QIDS[0])) is None  # the ack: stored by then
    assert [s.qid for s in rig.store.load()[0]] == [QIDS[0]]
    start = rig.questions.expect(StartQuestion)
    assert start.spec.qid == QIDS[0] and start.child == f"question:{QIDS[0]}:t.0.1"
    assert rig.store.open_spec(QIDS[0], start.child) is not None  # owned by the child
    sent = rig.delivery.expect(SendText)
    assert (sent.qid, sent.purpose, sent.reply_to) == (QIDS[0], "question", start.slot)
    assert rig.depth() == 1


def test_past_max_open_a_prompt_is_refused_and_nothing_is_stored(make: Any) -> None:
    # nacked at once with the count; the open ones are untouched
    rig = make(max_open=3)
    for qid in QIDS[:3]:
        rig.opened(prompt_envelope(qid))
    assert rig.admit(prompt_envelope(QIDS[3])) == "bridge has 3 open questions; try again later"
    assert [s.qid for s in rig.store.load()[0]] == QIDS[:3]
    rig.questions.assert_nothing()  # the nack is replied after the turn's tells
    assert rig.depth() == 3
    assert rig.ref.is_alive()
    # its own asker's resend of an open question is acked, not refused (X2), nor stored again
    assert rig.admit(prompt_envelope(QIDS[0])) is None
    rig.questions.assert_nothing()


def test_an_invalid_qid_is_answered_with_an_error_and_not_stored(make: Any) -> None:
    # C3
    rig = make()
    bad = prompt_envelope("not-a-ulid")
    assert rig.admit(bad) is None
    assert rig.peer.expect(SendResponse) == SendResponse(bad, None, INVALID_QID_ERROR)
    assert rig.store.load() == ([], [])


# -- answers -----------------------------------------------------------------------


def test_an_answer_reaches_its_question_once(make: Any) -> None:
    # Watcher -> Router -> Question; the second sighting is dropped
    # until the question restarts
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    rig.depth()  # both handled
    held = start.slot.held  # nobody runs the question here: the slot holds for it
    assert len(held) == 1 and isinstance(held[0], AnswerArrived) and held[0].answer.answer == "yes"
    rig.ref.tell(QuestionRestarted(QIDS[0], start.child))
    # the answer may have died with it: the watcher is asked for the file again
    assert rig.watcher.expect(OfferAgain) == OfferAgain(name)
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    rig.depth()
    assert len(start.slot.held) == 2
    rig.watcher.assert_nothing()


def test_a_foreign_file_is_refused_without_reading_it(make: Any) -> None:
    rig = make()
    name = f"{QIDS[1]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, b"{not json", SIG))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(
        name, SIG, Rejected("foreign_qid", QIDS[1])
    )


def test_a_bad_answer_to_an_open_question_is_refused(make: Any) -> None:
    rig = make()
    rig.opened(prompt_envelope(QIDS[0]))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[1]), SIG))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(
        name, SIG, Rejected("qid_mismatch", QIDS[0]))


def test_a_file_whose_name_is_no_answer_files_is_refused_by_its_name(make: Any) -> None:
    # C9: the name alone decides; the version refused is the one seen
    rig = make()
    rig.ref.tell(AnswerFileSeen("notes.txt", b"{}", SIG))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(
        "notes.txt", SIG, Rejected("invalid_path"))


def test_a_late_answer_owes_its_note_when_judged(make: Any) -> None:
    # C15: the note is in the store before Delivery is told; the file is to go (the
    # Watcher then never offers that version again: one note per version)
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    rig.ref.tell(QuestionClosed(QIDS[0], "cancelled", start.child))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    assert rig.watcher.expect(RemoveAnswerFile) == RemoveAnswerFile(name, SIG)
    record = rig.logger.expect(LogEvent).record
    assert (record.event, record.detail) == ("late_answer", {"state": "cancelled"})
    note = rig.delivery.expect(SendText)
    while note.purpose != "late_note":
        note = rig.delivery.expect(SendText)
    assert note.text == late_note(QIDS[0]) and note.note_id is not None
    assert rig.store.owed_notes() == [note]
    rig.depth()
    rig.delivery.assert_nothing()
    rig.logger.assert_nothing()


def test_the_file_that_answered_a_question_is_not_late(make: Any) -> None:
    # a crash between storing the answer and removing its file
    rig = make()
    envelope = prompt_envelope(QIDS[0])
    spec = QuestionSpec(QIDS[0], envelope, parse_prompt(envelope), 1, time.time())
    rig.store.put_open(spec, owner="q")
    rig.store.close(QIDS[0], "answered", owner="q", answer_file=(f"{QIDS[0]}.answer.json", SIG))
    rig.ref.stop()
    rig = make()
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    assert rig.watcher.expect(RemoveAnswerFile) == RemoveAnswerFile(name, SIG)
    rig.depth()  # that turn is over
    rig.logger.assert_nothing()


def test_the_file_that_answered_is_not_late_before_the_watcher_removed_it(make: Any) -> None:
    # a rescan re-offering the answering file between the close and its
    # removal logged a spurious late_answer and sent a late note to the human
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    rig.depth()
    assert len(start.slot.held) == 1  # AnswerArrived
    # the question closes its row with the file that answered, then says so
    rig.store.close(QIDS[0], "answered", owner=start.child, answer_file=(name, SIG))
    rig.ref.tell(QuestionClosed(QIDS[0], "answered", start.child))
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))  # offered again
    assert rig.watcher.expect(RemoveAnswerFile) == RemoveAnswerFile(name, SIG)
    rig.depth()  # that turn is over
    rig.logger.assert_nothing()
    assert rig.store.owed_notes() == []
    # another version of the file after the close is late, as before (C15)
    other = FileSignature(SIG.inode, SIG.size + 1, SIG.mtime_ns)
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), other))
    assert rig.watcher.expect(RemoveAnswerFile) == RemoveAnswerFile(name, other)
    assert rig.logger.expect(LogEvent).record.event == "late_answer"


# -- cancel, close, restore ---------------------------------------------------------


def test_cancel_goes_to_the_open_question_only(make: Any) -> None:
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    for ref in (QIDS[0], QIDS[1]):
        cancel = CancelEnvelope.model_validate(
            {"msg_id": QIDS[5], "from": "builder", "to": "user-remote",
             "created_at": "2026-11-30T12:00:00.000Z", "ref_msg_id": ref}
        )
        rig.ref.tell(CancelQuestion(cancel))
    rig.depth()
    assert start.slot.held == (CancelRequested(),)


def test_a_closed_question_leaves_the_table_and_only_its_own_child_closes_it(make: Any) -> None:
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    rig.ref.tell(QuestionClosed(QIDS[0], "answered", "question:someone-else"))
    assert rig.depth() == 1
    rig.ref.tell(QuestionClosed(QIDS[0], "answered", start.child))
    assert rig.depth() == 0
    assert rig.actor.closed == {QIDS[0]: "answered"}


def test_start_restores_open_questions_and_sends_what_is_owed(make: Any) -> None:
    # restore: pending questions are sent again, owed notes and responses too
    first = make()
    first.opened(prompt_envelope(QIDS[0]))
    second_start = first.opened(prompt_envelope(QIDS[1]))
    first.store.set_state(QIDS[1], "delivered", owner=second_start.child)
    note = SendText(QIDS[2], "ℹ note", "late_note", note_id="late:x")
    first.store.owe_note(note)
    first.ref.stop()
    rig = make()
    starts = [rig.questions.expect(StartQuestion), rig.questions.expect(StartQuestion)]
    assert [s.spec.qid for s in starts] == QIDS[:2]
    assert [s.spec.state for s in starts] == [None, "delivered"]
    told = [rig.delivery.expect(SendText) for _ in range(2)]
    assert told[0] == note
    assert (told[1].qid, told[1].purpose, told[1].reply_to) == (QIDS[0], "question", starts[0].slot)
    rig.depth()  # the restore (before the first message) is over
    rig.delivery.assert_nothing()
    # the rows now belong to the new children
    assert rig.store.open_spec(QIDS[1], starts[1].child) is not None


# -- late files: each judged once, within a bounded memory (C15) ----------


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


def test_each_late_file_gets_its_own_note_and_log_line(make: Any) -> None:
    # C15, C20: two closed questions, one late file each: two notes, two lines naming them
    rig = make()
    for qid, state in ((QIDS[0], "cancelled"), (QIDS[1], "timeout")):
        start = rig.opened(prompt_envelope(qid))
        rig.ref.tell(QuestionClosed(qid, state, start.child))  # type: ignore[arg-type]
    for qid in QIDS[:2]:
        rig.ref.tell(AnswerFileSeen(f"{qid}.answer.json", answer_file(qid), SIG))
    assert [rig.watcher.expect(RemoveAnswerFile) for _ in range(2)] == [
        RemoveAnswerFile(f"{QIDS[0]}.answer.json", SIG),
        RemoveAnswerFile(f"{QIDS[1]}.answer.json", SIG),
    ]
    assert [(r.qid, r.detail) for r in _late_records(rig, 2)] == [
        (QIDS[0], {"state": "cancelled"}),
        (QIDS[1], {"state": "timeout"}),
    ]
    assert [n.text for n in _late_notes(rig, 2)] == [late_note(QIDS[0]), late_note(QIDS[1])]


# -- files for qids not open here (X6, X11) ----------------------------------------


def _spec(qid: str) -> QuestionSpec:
    envelope = prompt_envelope(qid)
    return QuestionSpec(qid, envelope, parse_prompt(envelope), 1000.0, time.time() + 60)


@pytest.mark.parametrize("how", ["open", "closed", "undelivered"])
def test_a_file_a_sibling_knows_is_left_for_it(make: Any, tmp_path: Path, how: str) -> None:
    # X6 as revised: another project's bridge beside ours owns the qid, up or down
    sibling = Store.open(tmp_path / "state-b.sqlite3")
    try:
        sibling.put_open(_spec(QIDS[1]), owner="q")
        if how != "open":
            sibling.close(QIDS[1], "answered" if how == "closed" else None, owner="q",
                          undelivered_at=time.time() if how == "undelivered" else None)
    finally:
        sibling.shutdown()  # down: its file still says what it owns
    rig = make()
    name = f"{QIDS[1]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[1]), SIG))
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(
        name, SIG, OwnedElsewhere(QIDS[1], "b"))
    rig.depth()  # that turn is over
    rig.logger.assert_nothing()


def test_a_siblings_undelivered_qid_past_the_hour_is_foreign(make: Any, tmp_path: Path) -> None:
    # X6, X11: a failed delivery is remembered for an hour only
    sibling = Store.open(tmp_path / "state-b.sqlite3")
    try:
        sibling.put_open(_spec(QIDS[1]), owner="q")
        sibling.close(QIDS[1], None, owner="q", undelivered_at=time.time() - 3601)
    finally:
        sibling.shutdown()
    rig = make()
    rig.ref.tell(AnswerFileSeen(f"{QIDS[1]}.answer.json", answer_file(QIDS[1]), SIG))
    assert rig.watcher.expect(DisposeAnswerFile).verdict == Rejected("foreign_qid", QIDS[1])


def test_an_answer_to_our_undelivered_question_gets_the_human_a_note(make: Any) -> None:
    # X11: hermes failed, yet the human answered: told, note owed, the file to go (the
    # Watcher then never offers that version again: one note per version)
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    rig.store.close(QIDS[0], None, owner=start.child, undelivered_at=time.time())
    rig.ref.tell(QuestionClosed(QIDS[0], None, start.child))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    assert rig.watcher.expect(RemoveAnswerFile) == RemoveAnswerFile(name, SIG)
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


def test_one_asker_past_its_limit_is_refused_and_others_are_not(make: Any) -> None:  # X10
    rig = make(max_open_per_asker=2)
    rig.opened(prompt_envelope(QIDS[0]))
    second = rig.opened(prompt_envelope(QIDS[1]))
    assert rig.admit(prompt_envelope(QIDS[2])) == "builder has 2 open questions; try again later"
    assert [spec.qid for spec in rig.store.load()[0]] == QIDS[:2]  # nothing stored
    other = prompt_envelope(QIDS[3], sender_name="reviewer")
    assert rig.admit(other) is None
    assert rig.questions.expect(StartQuestion).spec.qid == QIDS[3]
    assert rig.admit(prompt_envelope(QIDS[1])) is None  # its own resend: acked (X2)
    rig.ref.tell(QuestionClosed(QIDS[1], "answered", second.child))
    assert rig.admit(prompt_envelope(QIDS[4])) is None  # room again once one closed
    assert rig.questions.expect(StartQuestion).spec.qid == QIDS[4]


def test_an_answer_being_handled_when_all_questions_restart_is_offered_again(make: Any) -> None:
    # the QuestionSupervisor (or the Router) crashed while a question handled an answer:
    # its file is asked for again at once, for the question started anew from its row
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    rig.opened(prompt_envelope(QIDS[1]))
    name = f"{QIDS[0]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    rig.depth()
    assert isinstance(start.slot.held[0], AnswerArrived)
    rig.ref.tell(RestoreQuestions())
    assert rig.watcher.expect(OfferAgain) == OfferAgain(name)  # only the one being handled
    again = rig.questions.expect(StartQuestion)
    assert again.spec.qid == QIDS[0] and again.child != start.child
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[0]), SIG))
    rig.depth()
    assert isinstance(again.slot.held[0], AnswerArrived)
    rig.watcher.assert_nothing()


def test_a_restarted_router_has_every_open_questions_file_looked_at_again(make: Any) -> None:
    # the Router itself crashed: it cannot know which answer its old questions were
    # handling, so each open qid's file is offered again at once (the first start's deep
    # rescan covers that case on its own)
    first = make()
    first.opened(prompt_envelope(QIDS[0]))
    first.opened(prompt_envelope(QIDS[1]))
    first.watcher.assert_nothing()  # admission's reply comes after its turn's tells
    again = make(resume_owed=False)  # the same state file, as a restarted child
    offered = {again.watcher.expect(OfferAgain).name for _ in range(2)}
    assert offered == {f"{QIDS[0]}.answer.json", f"{QIDS[1]}.answer.json"}
    fresh = make(path="state-other.sqlite3")
    fresh.depth()  # its start (the restore) is over
    fresh.watcher.assert_nothing()


def test_siblings_are_not_read_when_our_own_memory_decides(make: Any) -> None:  # X11, X6
    # reading other bridges' state files costs I/O on the actors' thread: only when needed
    asked: list[str] = []
    rig = make(sibling=lambda qid: asked.append(qid) or "b")
    start = rig.opened(prompt_envelope(QIDS[0]))
    rig.store.close(QIDS[0], None, owner=start.child, undelivered_at=time.time())
    rig.ref.tell(QuestionClosed(QIDS[0], None, start.child))
    rig.ref.tell(AnswerFileSeen(f"{QIDS[0]}.answer.json", answer_file(QIDS[0]), SIG))
    assert rig.watcher.expect(RemoveAnswerFile).name == f"{QIDS[0]}.answer.json"  # X11's way
    rig.ref.tell(AnswerFileSeen(f"{QIDS[1]}.answer.json", answer_file(QIDS[1]), SIG))
    assert rig.watcher.expect(DisposeAnswerFile).verdict == OwnedElsewhere(QIDS[1], "b")
    assert asked == [QIDS[1]]


# -- what a start restores, and what it says (C18) --------------------------------


def test_a_start_resends_owed_responses_remembers_closed_states_and_says_so(
    make: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    first = make()
    first.opened(prompt_envelope(QIDS[0]))
    closing = first.opened(prompt_envelope(QIDS[1]))
    owed = SendResponse(prompt_envelope(QIDS[1]), None, "cancelled by the asker", closing.child)
    assert first.store.close(QIDS[1], "cancelled", owner=closing.child, response=owed)
    first.ref.stop()
    capsys.readouterr()
    rig = make()
    assert rig.peer.expect(SendResponse) == owed  # owed by the last run: sent again
    rig.depth()
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: info: restored 1 open and 1 closed question(s)\n")
    name = f"{QIDS[1]}.answer.json"
    rig.ref.tell(AnswerFileSeen(name, answer_file(QIDS[1]), SIG))
    record = _late_records(rig, 1)[0]
    assert (record.qid, record.detail) == (QIDS[1], {"state": "cancelled"})  # as it closed


@pytest.mark.parametrize("what", ["only closed", "nothing"])
def test_the_restore_line_counts_what_there_was_and_is_left_out_for_nothing(
    make: Any, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    first = make()
    if what == "only closed":
        start = first.opened(prompt_envelope(QIDS[0]))
        first.store.close(QIDS[0], "answered", owner=start.child)
    first.ref.stop()
    capsys.readouterr()
    make().depth()
    said = capsys.readouterr().err
    assert said == ("coms-hermes-bridge: info: restored 0 open and 1 closed question(s)\n"
                    if what == "only closed" else "")


def test_a_restarted_router_restores_without_a_line(
    make: Any, capsys: pytest.CaptureFixture[str]
) -> None:  # the line is the daemon's start, not each Router incarnation's
    first = make()
    first.opened(prompt_envelope(QIDS[0]))
    first.ref.stop()
    capsys.readouterr()
    rig = make(resume_owed=False)
    assert rig.questions.expect(StartQuestion).spec.qid == QIDS[0]
    rig.depth()
    assert capsys.readouterr().err == ""


def test_a_store_that_cannot_take_a_question_is_nacked_in_our_words_and_said(
    make: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # never a crash: the table is fine, the asker may try again
    import sqlite3

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


def test_the_memory_of_closed_questions_is_bounded_and_keeps_the_latest(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:  # bounded: CLOSED_MEMORY qids remembered (for late files and reused qids)
    monkeypatch.setattr("coms_hermes_bridge.actors.router.CLOSED_MEMORY", 2)
    rig = make()
    for qid in QIDS[:3]:
        start = rig.opened(prompt_envelope(qid))
        rig.ref.tell(QuestionClosed(qid, "answered", start.child))
    rig.depth()
    assert list(rig.actor.closed) == QIDS[1:3]


def test_a_restart_of_an_unknown_or_replaced_question_changes_nothing(make: Any) -> None:
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    rig.ref.tell(QuestionRestarted(QIDS[5], "question:nobody"))  # not open here
    rig.ref.tell(QuestionRestarted(QIDS[0], "question:an-older-child"))  # not this one
    rig.depth()
    assert rig.ref.is_alive() and rig.actor.open[QIDS[0]].child == start.child
    rig.watcher.assert_nothing()


def test_an_unknown_message_names_the_router_and_the_message(make: Any) -> None:
    rig = make()
    rig.ref.tell(("no", "such"))
    assert rig.supervisor.next().error == (
        "UnknownMessage: router does not take tuple: ('no', 'such')")


def test_a_restored_question_still_pending_is_sent_to_telegram_again(make: Any) -> None:
    # it may or may not have reached Telegram before the stop: at least once
    first = make()
    start = first.opened(prompt_envelope(QIDS[0]))
    first.store.set_state(QIDS[0], "pending", owner=start.child)
    first.ref.stop()
    rig = make()
    again = rig.questions.expect(StartQuestion)
    assert again.spec.state == "pending"
    sent = rig.delivery.expect(SendText)
    assert (sent.qid, sent.purpose, sent.reply_to) == (QIDS[0], "question", again.slot)


def test_a_question_closed_between_the_restores_read_and_its_claim_stays_closed(
    make: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:  # restart-safe both ways: a question that ended meanwhile is never asked again
    rig = make()
    start = rig.opened(prompt_envelope(QIDS[0]))
    assert rig.delivery.expect(SendText).qid == QIDS[0]  # asked once, at admission
    read = rig.store.load

    def load_then_close() -> Any:
        rows = read()
        # the old question ends its row just after the Router read it, before the claim
        rig.store.close(QIDS[0], "answered", owner=start.child)
        return rows

    monkeypatch.setattr(rig.store, "load", load_then_close)
    rig.ref.tell(RestoreQuestions())
    assert rig.questions.expect(ResetQuestions) == ResetQuestions()
    assert rig.depth() == 0
    rig.questions.assert_nothing()  # not started again
    rig.delivery.assert_nothing()  # nor asked again
    assert read()[0] == []
