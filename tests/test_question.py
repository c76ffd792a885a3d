"""QuestionActor through its messages, with fake collaborators (C11, C13-C19)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors.base import Slot
from coms_hermes_bridge.actors.edge import shared_edge
from coms_hermes_bridge.actors.question import QuestionActor
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    AnswerArrived,
    AnswerFileSeen,
    CancelRequested,
    ChildFailed,
    Delivered,
    DeliveryFailed,
    DisposeAnswerFile,
    FileSignature,
    LogEvent,
    QuestionClosed,
    QuestionSpec,
    RemindDue,
    RemoveAnswerFile,
    SendResponse,
    SendText,
    TimedOut,
)
from coms_hermes_bridge.messages.contract import parse_prompt
from coms_hermes_bridge.messages.wire import AnswerFile, State
from tests.fakes import (
    ActorRig,
    FakeClock,
    FakeRef,
    actors_held,
    prompt_envelope,
    thread_count,
    wait_for,
)

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
QUESTION_ROLES = ("supervisor", "router", "peer", "delivery", "logger", "watcher")
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
SIG = FileSignature(inode=7, size=80, mtime_ns=1)
PROMPT = prompt_envelope(QID, text=json.dumps(
    {"question": "Ship?", "options": [{"title": "Approve", "description": "go"}, "Stop"]}
))


class Rig(ActorRig[QuestionActor]):
    """A QuestionActor for QID, through the Slot its supervisor would hand it."""

    def __init__(self, spec: QuestionSpec, store: Store | None, **options: Any) -> None:
        self.slot = Slot("question")
        super().__init__(QuestionActor, QUESTION_ROLES, spec=spec, me=self.slot,
                         target="telegram", name="question:x:1", store=store, now=lambda: NOW,
                         **options)
        self.slot.bind(self.ref)

    def events(self, count: int) -> list[tuple[str, Any]]:
        """The next `count` log events as (event, detail)."""
        out = []
        for _ in range(count):
            record = self.logger.expect(LogEvent).record
            assert record.qid == QID and record.at == "2026-11-30T12:00:00.000Z"
            out.append((record.event, record.detail))
        return out


@pytest.fixture
def start() -> Iterator[Any]:
    def _start(
        state: State | None = None, timeout_s: float = 60.0, store: Store | None = None
    ) -> Rig:
        spec = QuestionSpec(
            qid=QID,
            prompt=PROMPT,
            parsed=parse_prompt(PROMPT),
            timeout_ms=timeout_s * 1000,
            deadline=time.time() + timeout_s,
            state=state,
        )
        if store is not None:
            store.put_open(spec, owner="question:x:1")
        return Rig(spec, store)

    yield _start



def answer(text: str) -> AnswerArrived:
    body = AnswerFile(qid=QID, answer=text, answered_by="telegram:alice", at="2026-11-30T12:01:00Z")
    return AnswerArrived(body, f"{QID}.answer.json", SIG)


def _row_state(store: Store) -> Any:
    spec = store.open_spec(QID, "question:x:1")
    return spec.state if spec is not None else "gone"


def test_new_question_is_logged_and_stored(start: Any, tmp_path: Any) -> None:
    # C2, C19: none + question_received -> pending (the Router requests delivery);
    # the store row is the one record of the state
    store = Store.open(tmp_path / "state.sqlite3")
    rig = start(store=store)
    assert rig.events(1) == [("question_received", {"from": "builder"})]
    assert _row_state(store) == "pending"
    rig.sync()  # its first turn (begin) is over; its timer is 60 s away
    rig.delivery.assert_nothing()
    rig.supervisor.assert_nothing()
    rig.router.assert_nothing()
    store.shutdown()


def test_delivered(start: Any, tmp_path: Any) -> None:
    # C19: pending + delivered -> delivered, logged with the target, stored
    store = Store.open(tmp_path / "state.sqlite3")
    rig = start(store=store)
    rig.slot.tell(Delivered(QID))
    assert rig.events(2)[1] == ("delivered", {"to": "telegram"})
    assert _row_state(store) == "delivered"
    assert rig.ref.is_alive()
    store.shutdown()


def test_delivery_failure_drops_the_question_and_tells_the_asker(start: Any) -> None:
    # C18, C19: pending + delivery_error -> none; error response at once
    rig = start()
    rig.slot.tell(DeliveryFailed(QID, "hermes send failed (3): chat not found"))
    assert rig.events(2)[1] == ("delivery_error", {"error": "hermes send failed (3): chat not found"})
    assert rig.peer.expect(SendResponse) == SendResponse(
        PROMPT, None, "hermes send failed (3): chat not found", "question:x:1"
    )
    assert rig.router.expect(QuestionClosed) == QuestionClosed(QID, None, "question:x:1")
    assert rig.supervisor.expect(QuestionClosed) == QuestionClosed(QID, None, "question:x:1")
    rig.stopped()


@pytest.mark.parametrize("delivered", [True, False])
@pytest.mark.parametrize(
    ("text", "response"),
    [
        (" 1 ", {"kind": "selection", "selections": ["Approve"]}),
        ("stop", {"kind": "selection", "selections": ["Stop"]}),
        ("3", {"kind": "freeform", "text": "3"}),
        ("  later ", {"kind": "freeform", "text": "later"}),
    ],
)
def test_answer_closes_the_question(
    start: Any, delivered: bool, text: str, response: dict[str, Any]
) -> None:
    # C11, C19: pending|delivered + answered -> answered; mapped response; file removed
    rig = start()
    if delivered:
        rig.slot.tell(Delivered(QID))
    rig.slot.tell(answer(text))
    events = rig.events(3 if delivered else 2)
    assert events[-1] == ("answered", {"answered_by": "telegram:alice"})
    assert rig.peer.expect(SendResponse) == SendResponse(PROMPT, response, None, "question:x:1")
    assert rig.watcher.expect(RemoveAnswerFile) == RemoveAnswerFile(f"{QID}.answer.json", SIG)
    assert rig.router.expect(QuestionClosed).state == "answered"
    assert rig.supervisor.expect(QuestionClosed).state == "answered"
    rig.stopped()


@pytest.mark.parametrize("delivered", [True, False])
def test_cancel_sends_the_note_and_no_response(start: Any, delivered: bool) -> None:
    # C13, C19: pending|delivered + cancelled -> cancelled
    rig = start()
    if delivered:
        rig.slot.tell(Delivered(QID))
    rig.slot.tell(CancelRequested())
    assert rig.events(3 if delivered else 2)[-1] == ("cancelled", {"reason": "cancel envelope"})
    note = rig.delivery.expect(SendText)
    assert note.purpose == "cancel_note" and note.reply_to is None
    assert note.note_id == "question:x:1:cancel_note"
    assert note.text == f"✖ [HUB-Q:{QID}] The question was cancelled — it was answered from the console."
    assert rig.router.expect(QuestionClosed).state == "cancelled"
    rig.stopped()
    rig.peer.assert_nothing()


@pytest.mark.parametrize("delivered", [True, False])
def test_timer_expiry(start: Any, delivered: bool) -> None:
    # C16, C17, C19: the timer fires at the deadline; note and error response
    rig = start(timeout_s=0.25)
    if delivered:
        rig.slot.tell(Delivered(QID))
    events = rig.events(3 if delivered else 2)
    assert events[-1] == ("timeout", {"timeout_ms": 250})
    note = rig.delivery.expect(SendText)
    assert note.purpose == "timeout_note" and note.note_id == "question:x:1:timeout_note"
    assert note.text == f"⌛ [HUB-Q:{QID}] The question timed out after 250ms."
    assert rig.peer.expect(SendResponse) == SendResponse(
        PROMPT, None, "no remote answer within 250ms", "question:x:1"
    )
    assert rig.router.expect(QuestionClosed).state == "timeout"


@pytest.mark.parametrize(
    ("closing", "state"),
    [(answer("1"), "answered"), (CancelRequested(), "cancelled"), (TimedOut(), "timeout")],
)
def test_answer_after_each_terminal_state_is_late(start: Any, closing: Any, state: str) -> None:
    # C15, C19: answered|cancelled|timeout + late_answer -> unchanged
    rig = start()
    rig.sync()
    with actors_held():  # both queued at once
        rig.slot.tell(closing)
        rig.slot.tell(answer("2"))  # queued before the actor stops itself
    # told after its close, so the Router judges the file knowing the question is closed:
    # late (C15), by the one path that owes the note
    assert rig.router.next() == QuestionClosed(QID, state, "question:x:1")  # type: ignore[arg-type]
    assert rig.router.next() == AnswerFileSeen(f"{QID}.answer.json", None, SIG)
    told = [rig.watcher.inbox.get_nowait() for _ in range(rig.watcher.inbox.qsize())]
    assert not [m for m in told if isinstance(m, DisposeAnswerFile)]  # nothing judged here
    rig.stopped()
    rest = [rig.router.inbox.get_nowait() for _ in range(rig.router.inbox.qsize())]
    assert not [m for m in rest if isinstance(m, QuestionClosed)]  # closed exactly once


def test_restart_from_delivered_keeps_the_deadline_and_does_not_resend(start: Any) -> None:
    # restart from the last reported state: no second question_received, no second send
    rig = start(state="delivered", timeout_s=0.2)
    assert rig.events(1) == [("timeout", {"timeout_ms": 200})]
    note = rig.delivery.expect(SendText)
    assert note.purpose == "timeout_note"


def test_restart_with_passed_deadline_times_out_at_once(start: Any) -> None:
    rig = start(state="pending", timeout_s=-5)
    assert rig.events(1)[0][0] == "timeout"


def test_unknown_message_crashes_loudly_to_the_supervisor(start: Any) -> None:
    # DESIGN: an unknown message is a bug that fails loudly
    rig = start()
    rig.sync()
    with actors_held():  # both queued before the first is handled
        rig.slot.tell("what is this")
        rig.slot.tell(Delivered(QID))
    failed = rig.supervisor.expect(ChildFailed)
    assert failed.child == "question:x:1" and "str" in failed.error
    assert failed.unread == (Delivered(QID),)


class SnapshotPeer(FakeRef):
    """A Peer that notes what the store's outbox held at the moment it was told."""

    def __init__(self, store: Store) -> None:
        super().__init__("peer")
        self.store = store
        self.outbox_when_told: list[list[SendResponse]] = []

    def tell(self, message: Any) -> None:
        self.outbox_when_told.append(self.store.outbox())
        super().tell(message)


@pytest.mark.parametrize("ending", ["answered", "timeout", "delivery_error"])
def test_the_owed_response_is_durable_before_the_peer_is_told(
    start: Any, tmp_path: Any, ending: str
) -> None:
    # restart safety: the closing state and the owed response are stored first
    store = Store.open(tmp_path / "state.sqlite3")
    rig = start(store=store, timeout_s=0.3 if ending == "timeout" else 60)
    peer = SnapshotPeer(store)
    rig.ref.proxy().peer = peer  # white-box: swap in the snapshotting collaborator
    if ending == "answered":
        rig.slot.tell(Delivered(QID))
        rig.slot.tell(answer("stop"))
    elif ending == "delivery_error":
        rig.slot.tell(DeliveryFailed(QID, "hermes send failed (1)"))
    sent = peer.expect(SendResponse)
    assert sent.owner == "question:x:1"
    assert peer.outbox_when_told == [[sent]]
    closed = [] if ending == "delivery_error" else [(QID, ending)]
    assert store.load() == ([], closed)
    if ending == "answered":
        assert store.answered_by(QID) == (f"{QID}.answer.json", SIG)
    store.shutdown()


def test_a_replaced_question_does_nothing_more(start: Any, tmp_path: Any) -> None:
    # a repeated qid gave the row to a successor: the old actor's timer must not
    # log, note, answer or close anything in the qid's name
    store = Store.open(tmp_path / "state.sqlite3")
    rig = start(store=store)
    rig.events(1)
    successor = QuestionSpec(QID, PROMPT, parse_prompt(PROMPT), 60_000, time.time() + 60)
    store.put_open(successor, owner="question:x:2")
    rig.slot.tell(TimedOut())
    wait_for(lambda: not rig.ref.is_alive(), what="the replaced actor stops")
    rig.logger.assert_nothing()
    rig.peer.assert_nothing()
    rig.delivery.assert_nothing()
    rig.router.assert_nothing()
    # its supervisor forgets it (nothing to restart, nothing to watch over)
    assert rig.supervisor.expect(QuestionClosed) == QuestionClosed(QID, None, "question:x:1")
    assert [s.qid for s in store.load()[0]] == [QID] and store.outbox() == []
    store.shutdown()


@pytest.mark.parametrize("state", ["answered", "cancelled", "timeout"])
def test_restart_in_a_terminal_state_closes_at_once(start: Any, state: State) -> None:
    # crashed after its end but before reporting it: it must not linger as open
    rig = start(state=state)
    assert rig.router.expect(QuestionClosed) == QuestionClosed(QID, state, "question:x:1")
    rig.stopped()
    rig.logger.assert_nothing()


class SnapshotDelivery(FakeRef):
    """A Delivery that notes which notes the store owed at the moment it was told."""

    def __init__(self, store: Store) -> None:
        super().__init__("delivery")
        self.store = store
        self.owed_when_told: list[list[SendText]] = []

    def tell(self, message: Any) -> None:
        self.owed_when_told.append(self.store.owed_notes())
        super().tell(message)


@pytest.mark.parametrize("ending", ["cancelled", "timeout"])
def test_the_note_is_owed_in_the_closing_transaction(
    start: Any, tmp_path: Any, ending: str
) -> None:
    # the note is stored with the state change that causes it, before
    # Delivery is told, and stays owed until hermes has run it
    store = Store.open(tmp_path / "state.sqlite3")
    rig = start(store=store, timeout_s=0.3 if ending == "timeout" else 60)
    delivery = SnapshotDelivery(store)
    rig.ref.proxy().delivery = delivery  # white-box: swap in the snapshotting collaborator
    if ending == "cancelled":
        rig.slot.tell(CancelRequested())
    note = delivery.expect(SendText)
    assert delivery.owed_when_told == [[note]]
    assert store.load() == ([], [(QID, ending)])
    assert store.owed_notes() == [note]
    store.note_sent(note.note_id or "")
    assert store.owed_notes() == []
    store.shutdown()


def edge_passed(when: float) -> None:
    """Returns once every edge timer due by the wall clock's `when` has fired (they fire
    in order): a deterministic sync for "nothing fired", instead of a sleep."""
    passed = threading.Event()
    shared_edge().at(when, passed.set)
    assert passed.wait(when - time.time() + 5), "the edge's timers stalled"


def test_timer_fires_at_the_absolute_deadline_across_a_restart() -> None:
    # C16: a restarted question keeps its stored deadline; the first one's timer goes with it
    deadline = time.time() + 1.0
    spec = QuestionSpec(
        qid=QID, prompt=PROMPT, parsed=parse_prompt(PROMPT), timeout_ms=100_000.0,
        deadline=deadline, state="delivered",
    )
    fakes = {n: FakeRef(n) for n in QUESTION_ROLES}

    def run(name: str) -> tuple[pykka.ActorRef[Any], Slot]:
        slot = Slot(name)
        ref = QuestionActor.start(spec=spec, me=slot, target="telegram", name=name,
                                  now=lambda: NOW, **fakes)
        slot.bind(ref)
        return ref, slot

    first, first_slot = run("question:x:1")
    first.ask(Delivered(QID))  # a turn after begin(): its timer is set
    first.stop()
    second, _ = run("question:x:2")  # the restart: same stored deadline
    assert fakes["logger"].expect(LogEvent, timeout=5).record.event == "timeout"
    assert time.time() >= deadline  # not a moment before
    assert fakes["peer"].expect(SendResponse).error == "no remote answer within 100000ms"
    edge_passed(deadline + 0.1)
    assert first_slot.held == ()  # the stopped one's timer was cancelled: it told nobody
    wait_for(lambda: not second.is_alive(), what="the restarted one stops")  # timed out
    fakes["logger"].assert_nothing()  # both are over, their timers fired or cancelled


def test_two_thousand_open_questions_run_on_a_few_threads(tmp_path: Any) -> None:
    # every question an actor with its own mailbox and deadline, yet the
    # thread count stays flat (<= 40 for the process, as /proc/self/status counts)
    store = Store.open(tmp_path / "state.sqlite3")
    fakes = {n: FakeRef(n) for n in QUESTION_ROLES}
    before = thread_count()
    slots = []
    for i in range(2000):
        qid = f"01ARZ3NDEKTSV4RRFFQ{i:07d}"
        spec = QuestionSpec(qid=qid, prompt=PROMPT, parsed=parse_prompt(PROMPT),
                            timeout_ms=600_000.0, deadline=time.time() + 600, state=None)
        store.put_open(spec, owner=f"question:x:{i}")
        slot = Slot(qid)
        ref = QuestionActor.start(spec=spec, me=slot, target="telegram",
                                  name=f"question:x:{i}", store=store, now=lambda: NOW,
                                  **fakes)
        slot.bind(ref)
        slots.append((qid, slot))
    for qid, slot in slots:
        slot.tell(Delivered(qid))
    delivered = 0
    while delivered < 2000:
        if fakes["logger"].expect(LogEvent, timeout=30).record.event == "delivered":
            delivered += 1
    assert sum(1 for _, slot in slots if slot.ref is not None and slot.ref.is_alive()) == 2000
    after = thread_count()
    assert after <= 40, after
    assert after - before <= 1  # the edge's thread (turns and timers), if it was not up yet
    store.shutdown()


# -- the reminder (X9) -------------------------------------------------------------


def _reminded_rig(tmp_path: Any, *, reminded: bool = False, state: State = "delivered",
                  remind_before_ms: float | None = 30_000, remind_in_s: float = 0.5,
                  left_s: float = 30.0) -> tuple[Rig, Store, float]:
    """A 100 s question whose reminder (30 s before its deadline) is due in `remind_in_s`
    by the wall clock, as the edge reads it; the question reads `left_s` left then."""
    deadline = time.time() + remind_in_s + 30
    clock = FakeClock()
    clock.now = deadline - left_s
    store = Store.open(tmp_path / "state.sqlite3")
    spec = QuestionSpec(qid=QID, prompt=PROMPT, parsed=parse_prompt(PROMPT),
                        timeout_ms=100_000.0, deadline=deadline, state=state,
                        reminded=reminded)
    store.put_open(spec, owner="question:x:1")
    rig = Rig(spec, store, clock=clock, remind_before_ms=remind_before_ms)
    return rig, store, deadline - 30


def test_one_reminder_at_deadline_minus_remind_before_owed_and_logged(tmp_path: Any) -> None:
    # X9: at deadline - 30 s of a 100 s question: one note, stored as owed, marked on the row
    rig, store, due = _reminded_rig(tmp_path)
    note = rig.delivery.expect(SendText, timeout=5)
    assert time.time() >= due  # not a moment before
    assert (note.purpose, note.note_id) == ("remind_note", f"remind:{QID}")
    assert note.text == f"⏰ [HUB-Q:{QID}] Still waiting for your answer, 30s left: Ship?"
    assert rig.events(1) == [("reminded", {"left_ms": 30_000})]
    assert store.owed_notes() == [note]
    assert store.open_spec(QID, "question:x:1").reminded  # type: ignore[union-attr]
    rig.slot.tell(RemindDue())  # a second due (a replay): nothing more
    rig.slot.tell(CancelRequested())
    assert rig.delivery.expect(SendText).purpose == "cancel_note"
    assert [n.purpose for n in store.owed_notes()] == ["cancel_note"]  # the reminder withdrawn
    rig.stopped()
    rig.delivery.assert_nothing()
    store.shutdown()


@pytest.mark.parametrize(("reminded", "remind_before_ms"), [(True, 30_000), (False, 100_000),
                                                            (False, None)])
def test_no_reminder_when_decided_too_late_or_off(
    tmp_path: Any, reminded: bool, remind_before_ms: float | None
) -> None:  # X9: decided before a restart; as long as the question; off by default
    rig, store, due = _reminded_rig(
        tmp_path, reminded=reminded, remind_before_ms=remind_before_ms, remind_in_s=0.2)
    edge_passed(due + 0.05)  # a reminder armed for `due` would have been told by now
    rig.slot.tell(RemindDue())  # a due all the same (a replay): nothing to remind of
    rig.slot.tell(CancelRequested())  # a turn after it, to sync on
    assert rig.delivery.expect(SendText).purpose == "cancel_note"  # the first and only note
    assert [n.purpose for n in store.owed_notes()] == ["cancel_note"]
    store.shutdown()


def test_a_closed_question_is_not_reminded(tmp_path: Any) -> None:  # X9
    rig, store, _due = _reminded_rig(tmp_path, remind_in_s=30)
    rig.slot.tell(answer("2"))
    assert rig.peer.expect(SendResponse).error is None
    rig.slot.tell(RemindDue())  # due in the same instant: the question is over
    rig.stopped()
    rig.delivery.assert_nothing()
    store.shutdown()


def test_a_reminder_due_with_less_than_a_second_left_says_so(tmp_path: Any) -> None:  # X9
    # the daemon was down: the reminder's moment passed (it fires at once), not the deadline
    rig, store, _due = _reminded_rig(tmp_path, remind_in_s=-1, left_s=0.4)
    note = rig.delivery.expect(SendText)
    assert note.text == f"⏰ [HUB-Q:{QID}] Still waiting for your answer, 0s left: Ship?"
    assert rig.events(1) == [("reminded", {"left_ms": 400})]
    store.shutdown()


def test_no_reminder_for_a_question_past_its_deadline(tmp_path: Any) -> None:  # X9, C17
    # the daemon was down past both moments: the question times out, it is not reminded
    rig, store, _due = _reminded_rig(tmp_path, remind_in_s=30, left_s=-50)
    rig.slot.tell(RemindDue())  # the overdue reminder's message comes first
    rig.slot.tell(TimedOut())
    assert rig.delivery.expect(SendText).purpose == "timeout_note"  # the first and only note
    assert [n.purpose for n in store.owed_notes()] == ["timeout_note"]
    store.shutdown()
