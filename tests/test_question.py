"""QuestionActor through its messages, with fake collaborators and a real Store (C11, C13-C19).

Each question is started as the QuestionRouter starts one (`QuestionActor.start`: its
spec, its name and its collaborators) and reached through a Slot; its supervisor is the
router."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors.loop import shared_edge
from coms_hermes_bridge.actors.questions import QuestionActor
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.actors.supervision import Slot
from coms_hermes_bridge.messages.commands import (
    Address,
    AnswerArrived,
    CancelQuestion,
    ChildFailed,
    DisposeAnswerFile,
    FileSignature,
    HermesRan,
    LogEvent,
    QuestionClosed,
    QuestionSpec,
    RemindDue,
    SendResponse,
    SendText,
    TimedOut,
)
from coms_hermes_bridge.messages.contract import parse_prompt
from coms_hermes_bridge.messages.wire import AnswerFile, CancelEnvelope, State
from tests.fakes import (
    DISK_ERROR,
    ROLES,
    FailingConnection,
    FakeClock,
    FakeRef,
    WiredRig,
    actors_held,
    bridge_config,
    handled,
    prompt_envelope,
    thread_count,
    wait_for,
)

QID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
NAME = "question:x:1"
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
SIG = FileSignature(inode=7, size=80, mtime_ns=1)
NEWER = FileSignature(inode=8, size=81, mtime_ns=2)  # a second version of the same name
PROMPT = prompt_envelope(QID, text=json.dumps(
    {"question": "Ship?", "options": [{"title": "Approve", "description": "go"}, "Stop"]}
))

# the asker's own cancel, as the Router passes it on once it may cancel (C13, X2)
CANCEL = CancelQuestion(CancelEnvelope(msg_id="01HZY3K4M5N6P7Q8R9S0T1V2WX", from_="builder",
                                       to="user-remote", created_at="2026-11-30T12:00:00Z",
                                       ref_msg_id=QID))


def question_spec(*, timeout_s: float = 60.0, deadline: float | None = None,
                  state: State | None = None, reminded: bool = False,
                  qid: str = QID) -> QuestionSpec:
    """A question of `timeout_s`, asked now: its deadline `timeout_s` away unless given."""
    return QuestionSpec(qid=qid, prompt=PROMPT, parsed=parse_prompt(PROMPT),
                        timeout_ms=timeout_s * 1000,
                        deadline=time.time() + timeout_s if deadline is None else deadline,
                        state=state, reminded=reminded)


class Rig(WiredRig[QuestionActor]):
    """A QuestionActor for `spec`, its row in `store` owned by `name`, run as the Router
    runs one and reached through its Slot (`rig.slot`). Settings (the target is
    telegram) as `config` overrides; `addresses` replace a role's FakeRef."""

    def __init__(self, spec: QuestionSpec, store: Store, *, name: str = NAME,
                 clock: Callable[[], float] = time.time,
                 addresses: dict[str, Address] | None = None, **config: Any) -> None:
        self.spec, self.name, self.slot = spec, name, Slot(name)
        store.put_open(spec, owner=name)
        super().__init__(QuestionActor, store=store, config=bridge_config(**config),
                         now=lambda: NOW, clock=clock, addresses=addresses)
        self.slot.bind(self.ref)  # as the Router binds it once started

    def start(self, actor_class: type[QuestionActor], options: dict[str, Any]
              ) -> pykka.ActorRef[QuestionActor]:
        return actor_class.start(self.spec, self.name, **self.collaborators(actor_class))

    def events(self, count: int, timeout: float = 5.0) -> list[tuple[str, Any]]:
        """The next `count` log events as (event, detail)."""
        out: list[tuple[str, Any]] = []
        for _ in range(count):
            record = self.logger.expect(LogEvent, timeout).record
            assert record.qid == QID and record.at == "2026-11-30T12:00:00.000Z"
            out.append((record.event, record.detail))
        return out

    def rest(self, role: str) -> list[Any]:
        """Whatever `role` has been told and not read yet, now, without waiting."""
        fake = self.fakes[role]
        return [fake.inbox.get_nowait() for _ in range(fake.inbox.qsize())]


Start = Callable[..., Rig]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "state.sqlite3")
    yield store
    store.shutdown()


@pytest.fixture
def start(store: Store) -> Start:
    """A question's rig: `start(state=..., timeout_s=..., <Rig's keywords>)`."""

    def _start(*, state: State | None = None, timeout_s: float = 60.0, **options: Any) -> Rig:
        return Rig(question_spec(timeout_s=timeout_s, state=state), store, **options)

    return _start


def ran(error: str | None = None, qid: str = QID) -> HermesRan:
    """Delivery's word on the question's text: None when hermes sent it, else C18's error."""
    return HermesRan(SendText(qid, "❓ Ship?", "question"), error)


def answer(text: str, signature: FileSignature = SIG) -> AnswerArrived:
    body = AnswerFile(qid=QID, answer=text, answered_by="telegram:alice", at="2026-11-30T12:01:00Z")
    return AnswerArrived(body, f"{QID}.answer.json", signature)


def _row_state(store: Store) -> Any:
    spec = store.open_spec(QID, NAME)
    return spec.state if spec is not None else "gone"


def test_new_question_is_logged_and_stored(start: Start, store: Store) -> None:
    # C2, C19: none + question_received -> pending (the Router requests delivery);
    # the store row is the one record of the state
    rig = start()
    assert rig.events(1) == [("question_received", {"from": "builder"})]
    assert _row_state(store) == "pending"
    rig.sync()  # its first turn (begin) is over; its timer is 60 s away
    rig.delivery.assert_nothing()
    rig.router.assert_nothing()
    rig.peer.assert_nothing()


def test_delivered(start: Start, store: Store) -> None:
    # C19: pending + delivered -> delivered, logged with the target, stored
    rig = start()
    rig.slot.tell(ran())
    assert rig.events(2)[1] == ("delivered", {"to": "telegram"})
    assert _row_state(store) == "delivered"
    assert rig.ref.is_alive()


def test_delivery_failure_drops_the_question_and_tells_the_asker(
    start: Start, store: Store
) -> None:
    # C18, C19: pending + delivery_error -> none; error response at once
    rig = start()
    rig.slot.tell(ran("hermes send failed (3): chat not found"))
    assert rig.events(2)[1] == ("delivery_error", {"error": "hermes send failed (3): chat not found"})
    assert rig.peer.expect(SendResponse) == SendResponse(
        PROMPT, None, "hermes send failed (3): chat not found", NAME
    )
    assert rig.router.next() == QuestionClosed(QID, NAME, None)
    rig.stopped()
    rig.router.assert_nothing()  # closed exactly once
    assert store.load() == ([], [])  # C18: no trace of the qid as closed
    assert store.undelivered(QID, time.time())  # X11: remembered as undelivered


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
    start: Start, delivered: bool, text: str, response: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # C11, C19: pending|delivered + answered -> answered; mapped response; file removed
    rig = start()
    if delivered:
        rig.slot.tell(ran())
    rig.slot.tell(answer(text))
    events = rig.events(3 if delivered else 2)
    assert events[-1] == ("answered", {"answered_by": "telegram:alice"})
    assert rig.peer.expect(SendResponse) == SendResponse(PROMPT, response, None, NAME)
    assert rig.watcher.expect(DisposeAnswerFile) == DisposeAnswerFile(f"{QID}.answer.json", SIG)
    # the Router is told which file answered: every other version it routed here is late
    assert rig.router.next() == QuestionClosed(QID, NAME, (f"{QID}.answer.json", SIG))
    rig.stopped()
    rig.router.assert_nothing()
    # it let go of its timers once (at its close): its stop found nothing more to do
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pykka")
            and r.levelno >= logging.ERROR] == []


@pytest.mark.parametrize("delivered", [True, False])
def test_cancel_sends_the_note_and_no_response(start: Start, delivered: bool) -> None:
    # C13, C19: pending|delivered + cancelled -> cancelled
    rig = start()
    if delivered:
        rig.slot.tell(ran())
    rig.slot.tell(CANCEL)
    assert rig.events(3 if delivered else 2)[-1] == ("cancelled", {"reason": "cancel envelope"})
    note = rig.delivery.expect(SendText)
    assert note.purpose == "cancel_note"
    assert note.note_id == f"{NAME}:cancel_note"
    assert note.text == f"✖ [HUB-Q:{QID}] The question was cancelled — it was answered from the console."
    assert rig.router.next() == QuestionClosed(QID, NAME, None)
    rig.stopped()
    rig.peer.assert_nothing()


@pytest.mark.parametrize("delivered", [True, False])
def test_the_operators_cancel_tells_the_asker_and_the_human(
    start: Start, store: Store, delivered: bool
) -> None:
    # X15, C19: pending|delivered + cancelled -> cancelled; error response and the
    # operator's note, both owed in the store with the close (a restart sends them)
    rig = start()
    if delivered:
        rig.slot.tell(ran())
    rig.slot.tell(dataclasses.replace(CANCEL, by_operator=True))
    assert rig.events(3 if delivered else 2)[-1] == ("cancelled", {"by": "operator"})
    note = rig.delivery.expect(SendText)
    assert note == SendText(QID, f"✖ [HUB-Q:{QID}] The question was cancelled by the operator.",
                            "cancel_note", note_id=f"{NAME}:cancel_note")
    owed = SendResponse(PROMPT, None, "cancelled by the operator", NAME)
    assert rig.peer.expect(SendResponse) == owed
    assert rig.router.next() == QuestionClosed(QID, NAME, None)
    rig.stopped()
    assert store.outbox() == [owed]
    assert store.owed_notes() == [note]
    assert store.closed(QID) == ("cancelled", None)
    rig.peer.assert_nothing()
    rig.delivery.assert_nothing()


@pytest.mark.parametrize("delivered", [True, False])
def test_timer_expiry(start: Start, delivered: bool) -> None:
    # C16, C17, C19: the timer fires at the deadline; note and error response
    rig = start(timeout_s=0.25)
    if delivered:
        rig.slot.tell(ran())
    events = rig.events(3 if delivered else 2)
    assert events[-1] == ("timeout", {"timeout_ms": 250})
    note = rig.delivery.expect(SendText)
    assert note.purpose == "timeout_note" and note.note_id == f"{NAME}:timeout_note"
    assert note.text == f"⌛ [HUB-Q:{QID}] The question timed out after 250ms."
    assert rig.peer.expect(SendResponse) == SendResponse(
        PROMPT, None, "no remote answer within 250ms", NAME
    )
    assert rig.router.next() == QuestionClosed(QID, NAME, None)


@pytest.mark.parametrize(
    ("closing", "state"),
    [(answer("1"), "answered"), (CANCEL, "cancelled"), (TimedOut(), "timeout")],
)
def test_answer_after_each_terminal_state_is_late(start: Start, closing: Any, state: str) -> None:
    # C15, C19: answered|cancelled|timeout + late_answer -> unchanged. The question
    # drops the answer that reached it closed: the Router routed it, and judges it late
    # (C15) once it hears of the close, by the one path that owes the note (test_router)
    rig = start()
    rig.sync()
    with actors_held():  # both queued at once
        rig.slot.tell(closing)
        rig.slot.tell(answer("2", NEWER))  # queued before the actor stops itself
    name = f"{QID}.answer.json"
    answered = (name, SIG) if state == "answered" else None  # answer 1's file
    assert rig.router.next() == QuestionClosed(QID, NAME, answered)
    rig.stopped()
    assert rig.events(2)[1][0] == state  # (after question_received) and nothing more:
    assert rig.rest("logger") == []  # no late_answer from here, and no second close
    assert rig.rest("watcher") == ([DisposeAnswerFile(name, SIG)] if answered else [])
    assert len(rig.rest("peer")) == (state != "cancelled")  # the close's response alone
    rig.router.assert_nothing()  # closed exactly once


def test_restart_from_delivered_keeps_the_deadline_and_does_not_resend(start: Start) -> None:
    # restart from the last reported state: no second question_received, no second send
    rig = start(state="delivered", timeout_s=0.2)
    assert rig.events(1) == [("timeout", {"timeout_ms": 200})]
    note = rig.delivery.expect(SendText)
    assert note.purpose == "timeout_note"


def test_a_deadline_set_by_a_clock_that_ran_fast_is_cut_to_the_timeout(store: Store) -> None:
    # C16, X5: asked while the wall clock ran an hour fast, restarted once it is right: the
    # stored deadline is an hour and a bit away, yet it times out within its own 0.3 s
    asked = time.time()
    spec = question_spec(timeout_s=0.3, deadline=asked + 3600.3, state="delivered")
    rig = Rig(spec, store)
    assert rig.events(1) == [("timeout", {"timeout_ms": 300})]
    assert time.time() - asked < 5  # far from the hour


def test_a_deadline_within_the_timeout_is_kept_across_a_restart(store: Store) -> None:
    # C16: the cut never lengthens a question: the stored deadline, nearer, still decides
    rig = Rig(question_spec(timeout_s=3600, deadline=time.time() + 0.2, state="delivered"),
              store)
    assert rig.events(1, timeout=5) == [("timeout", {"timeout_ms": 3600000})]


def test_a_cut_deadline_is_stored_so_the_next_restart_keeps_it(store: Store) -> None:
    # C16, X5: the cut is written to the question's own row, not only kept in mind
    asked = time.time()
    rig = Rig(question_spec(timeout_s=60, deadline=asked + 3660, state="delivered"), store)
    rig.sync()
    spec = store.open_spec(QID, NAME)
    assert spec is not None and asked + 60 <= spec.deadline <= time.time() + 60


def test_a_deadline_that_stands_is_not_written_again(store: Store) -> None:
    # C16: only a cut deadline is stored: a question resumed with its own (every ordinary
    # restart) writes nothing as it starts, so a state file failing writes does not stop it
    spec = question_spec(state="delivered")
    first = Rig(spec, store)
    first.ref.stop()
    real = store._conn
    store._conn = FailingConnection(real, commit=DISK_ERROR)  # type: ignore[assignment]
    try:
        second = QuestionActor.start(spec, NAME, **first.collaborators(QuestionActor))
        handled(second)  # its begin() is over, and it lives
        first.router.assert_nothing()  # no crash told
    finally:
        store._conn = real


def test_restart_with_passed_deadline_times_out_at_once(start: Start) -> None:
    # C17: a deadline that passed while the daemon was down
    rig = start(state="pending", timeout_s=-5)
    assert rig.events(1)[0][0] == "timeout"


def test_unknown_message_crashes_loudly_to_the_supervisor(start: Start) -> None:
    # DESIGN: an unknown message is a bug that fails loudly to its supervisor (the
    # router); what it had not read is lost (the Router tells the successor again)
    rig = start()
    rig.sync()
    with actors_held():  # both queued before the first is handled
        rig.slot.tell("what is this")
        rig.slot.tell(ran())
    failed = rig.router.expect(ChildFailed)
    assert failed.child == NAME
    assert failed.error == f"UnknownMessage: {NAME} does not take str: 'what is this'"


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
    start: Start, store: Store, ending: str
) -> None:
    # restart safety: the closing state and the owed response are stored first
    peer = SnapshotPeer(store)
    rig = start(timeout_s=0.3 if ending == "timeout" else 60, addresses={"peer": peer})
    if ending == "answered":
        rig.slot.tell(ran())
        rig.slot.tell(answer("stop"))
    elif ending == "delivery_error":
        rig.slot.tell(ran("hermes send failed (1)"))
    sent = peer.expect(SendResponse)
    assert sent.owner == NAME
    assert peer.outbox_when_told == [[sent]]
    closed = [] if ending == "delivery_error" else [(QID, ending)]
    assert store.load() == ([], closed)
    if ending == "answered":
        assert store.closed(QID) == ("answered", (f"{QID}.answer.json", SIG))


@pytest.mark.parametrize("event", [TimedOut(), ran()])
def test_a_replaced_question_does_nothing_more(start: Start, store: Store,
                                               event: TimedOut | HermesRan) -> None:
    # a repeated qid gave the row to a successor: the old actor's timer (or its late
    # word of delivery) must not log, note, answer, close or move anything in its name
    rig = start()
    rig.events(1)
    successor = question_spec()
    store.put_open(successor, owner="question:x:2")
    rig.slot.tell(event)
    # its supervisor forgets it (nothing to restart, nothing to watch over)
    assert rig.router.next() == QuestionClosed(QID, NAME, None)
    rig.stopped()
    rig.logger.assert_nothing()
    rig.peer.assert_nothing()
    rig.delivery.assert_nothing()
    rig.router.assert_nothing()
    assert [s.qid for s in store.load()[0]] == [QID] and store.outbox() == []
    assert store.open_spec(QID, "question:x:2") == successor  # its state not moved


@pytest.mark.parametrize("state", ["answered", "cancelled", "timeout"])
def test_restart_in_a_terminal_state_closes_at_once(start: Start, state: State) -> None:
    # crashed after its end but before reporting it: it must not linger as open
    rig = start(state=state)
    assert rig.router.next() == QuestionClosed(QID, NAME, None)
    rig.stopped()
    rig.logger.assert_nothing()
    rig.router.assert_nothing()


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
    start: Start, store: Store, ending: str
) -> None:
    # the note is stored with the state change that causes it, before
    # Delivery is told, and stays owed until hermes has run it
    delivery = SnapshotDelivery(store)
    rig = start(timeout_s=0.3 if ending == "timeout" else 60, addresses={"delivery": delivery})
    if ending == "cancelled":
        rig.slot.tell(CANCEL)
    note = delivery.expect(SendText)
    assert delivery.owed_when_told == [[note]]
    assert store.load() == ([], [(QID, ending)])
    assert store.owed_notes() == [note]
    store.note_sent(note.note_id or "")
    assert store.owed_notes() == []


def edge_passed(when: float) -> None:
    """Returns once every edge timer due by the wall clock's `when` has fired (they fire
    in order): a deterministic sync for "nothing fired", instead of a sleep."""
    passed = threading.Event()
    edge = shared_edge()
    edge.call(lambda: edge.loop.call_later(when - time.time(), passed.set))
    assert passed.wait(when - time.time() + 5), "the edge's timers stalled"


def test_timer_fires_at_the_absolute_deadline_across_a_restart(store: Store) -> None:
    # C16: a restarted question keeps its stored deadline; the first one's timer goes with it
    deadline = time.time() + 1.0
    spec = question_spec(timeout_s=100, deadline=deadline, state="delivered")
    first = Rig(spec, store)
    first.ref.ask(ran())  # a turn after begin(): its timer is set
    timer = first.actor._timer
    assert timer is not None and not timer.cancelled()
    first.ref.stop()
    assert timer.cancelled()  # the stopped one's timer goes with it: it tells nobody
    # the restart, as a restarted Router's: the row claimed under a new name, same deadline
    assert store.claim(QID, "question:x:2")
    second = QuestionActor.start(spec, "question:x:2", **first.collaborators(QuestionActor))
    assert first.logger.expect(LogEvent, timeout=5).record.event == "timeout"
    assert time.time() >= deadline  # not a moment before
    assert first.peer.expect(SendResponse) == SendResponse(
        PROMPT, None, "no remote answer within 100000ms", "question:x:2")
    wait_for(lambda: not second.is_alive(), what="the restarted one stops")  # timed out
    first.logger.assert_nothing()  # both are over, their timers fired or cancelled


def test_a_deadline_past_2_to_the_31_ms_is_waited_for_whole(store: Store) -> None:
    # X17, C16: Node would fire such a timer after 1 ms; ours is set for the whole wait
    wait_s = (2**31 + 1000) / 1000
    rig = Rig(question_spec(timeout_s=wait_s, deadline=time.time() + wait_s, state="delivered"),
              store)
    rig.ref.ask(ran())  # a turn after begin(): its timer is set
    timer = rig.actor._timer
    assert timer is not None and not timer.cancelled()
    assert timer.when() - shared_edge().loop.time() > wait_s - 60
    rig.logger.assert_nothing()


def test_a_restored_question_logs_its_timeout_in_the_bytes_a_fresh_one_does(store: Store) -> None:
    # C17, C20: the row holds timeout_ms as a REAL; read back (a restart), the detail is
    # still the JavaScript number 250 a fresh question logs, not 250.0
    line = (f'{{"at":"2026-11-30T12:00:00.000Z","qid":"{QID}","event":"timeout",'
            '"detail":{"timeout_ms":250},"project":"p"}\n')
    fresh = dataclasses.replace(
        question_spec(deadline=time.time() + 0.25, state="delivered"), timeout_ms=250)
    first = Rig(fresh, store)
    assert first.logger.expect(LogEvent, timeout=5).record.to_line("p") == line
    wait_for(lambda: not first.ref.is_alive(), what="the fresh one times out")
    store.put_open(dataclasses.replace(fresh, deadline=time.time() + 0.25), owner="question:x:2")
    restored = store.open_spec(QID, "question:x:2")
    assert restored is not None
    QuestionActor.start(restored, "question:x:2", **first.collaborators(QuestionActor))
    assert first.logger.expect(LogEvent, timeout=5).record.to_line("p") == line


def test_two_thousand_open_questions_run_on_a_few_threads(store: Store) -> None:
    # every question an actor with its own mailbox and deadline, yet the
    # thread count stays flat (<= 40 for the process, as /proc/self/status counts)
    fakes = {role: FakeRef(role) for role in ROLES[1:]}
    config = bridge_config()
    wired = dict(store=store, logger=fakes["logger"], delivery=fakes["delivery"],
                 router=fakes["router"], watcher=fakes["watcher"], peer=fakes["peer"],
                 target=config.target, remind_before_ms=config.remind_before_ms,
                 now=lambda: NOW)
    before = thread_count()
    slots = []
    for i in range(2000):
        spec = question_spec(timeout_s=600, qid=f"01ARZ3NDEKTSV4RRFFQ{i:07d}")
        store.put_open(spec, owner=f"question:x:{i}")
        slot = Slot(f"question:x:{i}")
        slot.bind(QuestionActor.start(spec, f"question:x:{i}", **wired))
        slots.append((spec.qid, slot))
    for qid, slot in slots:
        slot.tell(ran(qid=qid))
    delivered = 0
    while delivered < 2000:
        if fakes["logger"].expect(LogEvent, timeout=30).record.event == "delivered":
            delivered += 1
    assert sum(1 for _, slot in slots if slot.ref is not None and slot.ref.is_alive()) == 2000
    after = thread_count()
    assert after <= 40, after
    assert after - before <= 1  # the edge's thread (turns and timers), if it was not up yet


# -- the reminder (X9) -------------------------------------------------------------


def _reminded_rig(store: Store, *, reminded: bool = False, state: State = "delivered",
                  remind_before_ms: float | None = 30_000, remind_in_s: float = 0.5,
                  left_s: float = 30.0) -> tuple[Rig, float]:
    """A 100 s question whose reminder (30 s before its deadline) is due in `remind_in_s`
    by the wall clock, as the edge reads it; the question reads `left_s` left then."""
    deadline = time.time() + remind_in_s + 30
    clock = FakeClock()
    clock.now = deadline - left_s
    spec = question_spec(timeout_s=100, deadline=deadline, state=state, reminded=reminded)
    rig = Rig(spec, store, clock=clock, remind_before_ms=remind_before_ms)
    return rig, deadline - 30


def test_one_reminder_at_deadline_minus_remind_before_owed_and_logged(store: Store) -> None:
    # X9: at deadline - 30 s of a 100 s question: one note, stored as owed, marked on the row
    rig, due = _reminded_rig(store)
    note = rig.delivery.expect(SendText, timeout=5)
    assert time.time() >= due  # not a moment before
    assert (note.purpose, note.note_id) == ("remind_note", f"remind:{QID}")
    assert note.text == f"⏰ [HUB-Q:{QID}] Still waiting for your answer, 30s left: Ship?"
    assert rig.events(1) == [("reminded", {"left_ms": 30_000})]
    assert store.owed_notes() == [note]
    assert store.open_spec(QID, NAME).reminded  # type: ignore[union-attr]
    rig.slot.tell(RemindDue())  # a second due (a replay): nothing more
    rig.slot.tell(CANCEL)
    assert rig.delivery.expect(SendText).purpose == "cancel_note"
    assert [n.purpose for n in store.owed_notes()] == ["cancel_note"]  # the reminder withdrawn
    rig.stopped()
    rig.delivery.assert_nothing()


def test_a_long_question_s_reminder_is_armed_for_its_deadline_minus_remind_before(
    store: Store,
) -> None:  # X9: counted from when it was asked (deadline - timeout), to the millisecond
    timeout_s = 100 * 86_400  # a hundred days: a slip of one part in a thousand is hours
    deadline = time.time() + timeout_s
    spec = question_spec(timeout_s=timeout_s, deadline=deadline, state="delivered")
    rig = Rig(spec, store, remind_before_ms=30_000)
    rig.sync()
    reminder = rig.actor._reminder
    assert reminder is not None
    due_in = reminder.when() - shared_edge().loop.time()
    assert abs(due_in - (deadline - 30 - time.time())) < 1.0


@pytest.mark.parametrize(("reminded", "remind_before_ms"), [(True, 30_000), (False, 100_000),
                                                            (False, None)])
def test_no_reminder_when_decided_too_late_or_off(
    store: Store, reminded: bool, remind_before_ms: float | None
) -> None:  # X9: decided before a restart; as long as the question; off by default
    rig, due = _reminded_rig(
        store, reminded=reminded, remind_before_ms=remind_before_ms, remind_in_s=0.2)
    edge_passed(due + 0.05)  # a reminder armed for `due` would have been told by now
    rig.slot.tell(RemindDue())  # a due all the same (a replay): nothing to remind of
    rig.slot.tell(CANCEL)  # a turn after it, to sync on
    assert rig.delivery.expect(SendText).purpose == "cancel_note"  # the first and only note
    assert [n.purpose for n in store.owed_notes()] == ["cancel_note"]


def test_a_closed_question_is_not_reminded(store: Store) -> None:  # X9
    rig, _due = _reminded_rig(store, remind_in_s=30)
    rig.slot.tell(answer("2"))
    assert rig.peer.expect(SendResponse).error is None
    rig.slot.tell(RemindDue())  # due in the same instant: the question is over
    rig.stopped()
    rig.delivery.assert_nothing()


def test_a_reminder_due_with_less_than_a_second_left_says_so(store: Store) -> None:  # X9
    # the daemon was down: the reminder's moment passed (it fires at once), not the deadline
    rig, _due = _reminded_rig(store, remind_in_s=-1, left_s=0.4)
    note = rig.delivery.expect(SendText)
    assert note.text == f"⏰ [HUB-Q:{QID}] Still waiting for your answer, 0s left: Ship?"
    assert rig.events(1) == [("reminded", {"left_ms": 400})]


@pytest.mark.parametrize("left_s", [-50, 0])
def test_no_reminder_for_a_question_past_its_deadline(store: Store, left_s: float) -> None:
    # X9, C17: the daemon was down past both moments (or to the very deadline): the
    # question times out, it is not reminded
    rig, _due = _reminded_rig(store, remind_in_s=30, left_s=left_s)
    rig.slot.tell(RemindDue())  # the overdue reminder's message comes first
    rig.slot.tell(TimedOut())
    assert rig.delivery.expect(SendText).purpose == "timeout_note"  # the first and only note
    assert [n.purpose for n in store.owed_notes()] == ["timeout_note"]
