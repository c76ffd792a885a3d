"""QuestionSupervisor with fake questions: restarts from the row, replay, poison."""

from __future__ import annotations

import errno
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from coms_hermes_bridge.actors.base import Slot
from coms_hermes_bridge.actors.question_supervisor import QuestionSupervisor
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.messages.commands import (
    Address,
    LogEvent,
    QuestionClosed,
    QuestionRestarted,
    QuestionSpec,
    ResetQuestions,
    RestoreQuestions,
    SendResponse,
    StartQuestion,
)
from coms_hermes_bridge.messages.contract import parse_prompt
from tests.fakes import (
    ActorRig,
    Boom,
    FakeClock,
    FakeRef,
    FakeSchedule,
    Hold,
    Recorder,
    Short,
    prompt_envelope,
    wait_for,
)

QID = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
CHILD = f"question:{QID}:run.1"
PROMPT = prompt_envelope(QID, text="Ship it?")


SUPERVISOR_ROLES = ("supervisor", "router", "peer", "logger")


class Rig(ActorRig[QuestionSupervisor]):
    """A QuestionSupervisor whose questions are Recorders telling `seen` what they
    read. Each start records the spec and what it was handed, or raises the next of
    `fails`. `options` are the supervisor's own."""

    def __init__(self, store: Store | None, **options: Any) -> None:
        self.store = store
        self.seen = FakeRef("seen")
        self.clock, self.schedule = FakeClock(), FakeSchedule()
        self.specs: list[QuestionSpec] = []
        self.given: list[tuple[Slot, Address]] = []  # what each start was handed
        self.fails: list[Exception] = []  # raised by the next starts, in turn
        self._incarnation = itertools.count()
        super().__init__(
            QuestionSupervisor, SUPERVISOR_ROLES, store=store,
            start_question=self._start_question, max_restarts=3, window_s=10,
            clock=self.clock, schedule=self.schedule, **options,
        )
        self.slot = Slot(CHILD)

    def _start_question(self, spec: QuestionSpec, child: str, slot: Slot, sup: Address) -> Any:
        self.specs.append(spec)
        self.given.append((slot, sup))
        if self.fails:
            raise self.fails.pop(0)
        return Recorder.start(supervisor=sup, seen=self.seen, name=child,
                              incarnation=next(self._incarnation))

    def start(self, spec: QuestionSpec) -> None:
        """Start QID's question from `spec` and wait until it runs."""
        self.ref.tell(StartQuestion(spec, CHILD, self.slot))
        wait_for(lambda: self.slot.ref, what="question started")

    def restarted(self, before: Any) -> None:
        wait_for(lambda: self.slot.ref not in (None, before), what="question restarted")


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    store = Store.open(tmp_path / "state.sqlite3")
    spec = QuestionSpec(QID, PROMPT, parse_prompt(PROMPT), 60_000, time.time() + 60)
    store.put_open(spec, owner=CHILD)
    store.set_state(QID, "delivered", owner=CHILD)
    rig = Rig(store)
    rig.start(spec)
    yield rig
    pykka.ActorRegistry.stop_all()
    store.shutdown()


def test_crashed_question_gets_its_unread_messages_in_order(rig: Rig) -> None:
    # replayed to the restarted question, ahead of what came later
    release = threading.Event()
    before = rig.slot.ref
    for message in (Hold(release), Boom(), "m1", "m2", "m3"):
        rig.slot.tell(message)
    release.set()
    rig.restarted(before)
    rig.slot.tell("m4")
    assert [rig.seen.next() for _ in range(4)] == [(1, "m1"), (1, "m2"), (1, "m3"), (1, "m4")]
    assert rig.router.expect(QuestionRestarted) == QuestionRestarted(QID, CHILD)


def test_a_restarted_question_resumes_from_its_row(rig: Rig) -> None:
    # the store row is the one record of the state
    before = rig.slot.ref
    rig.slot.tell(Boom())
    rig.restarted(before)
    assert rig.specs[0].state is None  # as the Router handed it over at admission
    assert rig.specs[1].state == "delivered"  # as the row says now


def test_poison_question_is_closed_with_an_error_and_the_rest_lives_on(rig: Rig) -> None:
    # past its own intensity the question is closed, its asker told,
    # the event logged, the row gone (not restored), and the supervisor alive
    for _ in range(3):
        before = rig.slot.ref
        rig.slot.tell(Boom())
        rig.restarted(before)
    rig.slot.tell(Boom())
    owed = rig.peer.expect(SendResponse)
    assert owed == SendResponse(
        PROMPT, None, "bridge failed on this question: RuntimeError: boom", CHILD
    )
    assert rig.router.expect(QuestionClosed) == QuestionClosed(QID, None, CHILD)
    record = rig.logger.expect(LogEvent).record
    assert (record.qid, record.event, record.detail) == (
        QID, "question_failed", {"error": "RuntimeError: boom"}
    )
    assert rig.store.load() == ([], [])  # not restored on the next start
    assert rig.store.outbox() == [owed]  # owed until the Peer has handed it over
    assert rig.ref.is_alive()
    rig.slot.tell("dropped")
    assert rig.slot.held == ()


def test_restarts_spread_over_time_are_not_poison(rig: Rig) -> None:
    for _ in range(3):
        before = rig.slot.ref
        rig.slot.tell(Boom())
        rig.restarted(before)
    rig.clock.now += 10.5
    before = rig.slot.ref
    rig.slot.tell(Boom())
    rig.restarted(before)
    rig.sync()
    rig.peer.assert_nothing()


def test_a_shortage_is_retried_with_backoff_not_counted(rig: Rig) -> None:
    # a shortage (no thread for it, say) is retried after a backoff, as for any child
    release = threading.Event()
    for attempt in range(5):
        before = rig.slot.ref
        if attempt == 0:
            rig.slot.tell(Hold(release))
        rig.slot.tell(Short(errno.EMFILE))
        if attempt == 0:  # unread work waits out the backoff and comes back in order
            rig.slot.tell("u1")
            rig.slot.tell("u2")
            release.set()
        wait_for(lambda n=attempt: len(rig.schedule.delays) == n + 1, what="retry scheduled")  # type: ignore[misc]
        rig.slot.tell(f"while down {attempt}")
        rig.schedule.fire()
        rig.restarted(before)
        if attempt == 0:
            assert [rig.seen.next(), rig.seen.next()] == [(1, "u1"), (1, "u2")]
        assert rig.seen.next() == (attempt + 1, f"while down {attempt}")
    assert rig.schedule.delays == [0.1, 0.2, 0.4, 0.8, 1.6]
    rig.sync()
    rig.peer.assert_nothing()


def test_a_closed_question_is_forgotten_and_never_restarted(rig: Rig) -> None:
    rig.ref.tell(QuestionClosed(QID, "answered", CHILD))
    rig.store.close(QID, "answered", owner=CHILD)
    before = rig.slot.ref
    rig.slot.tell(Boom())
    wait_for(lambda: before is not None and not before.is_alive(), what="crashed")
    rig.sync()  # its ChildFailed, told before it was dead, is handled
    rig.router.assert_nothing()
    rig.peer.assert_nothing()
    assert rig.slot.ref is None


def test_a_question_whose_row_is_gone_is_reported_closed(rig: Rig) -> None:
    # replaced by a repeated qid meanwhile: nothing to resume, the Router is told
    spec = rig.specs[0]
    rig.store.put_open(spec, owner="question:someone-else")
    rig.slot.tell(Boom())
    assert rig.router.expect(QuestionClosed) == QuestionClosed(QID, None, CHILD)
    rig.sync()
    assert rig.slot.ref is None  # not started again
    rig.seen.assert_nothing()


def test_reset_stops_every_question(rig: Rig) -> None:
    before = rig.slot.ref
    rig.ref.tell(ResetQuestions())
    wait_for(lambda: before is not None and not before.is_alive(), what="stopped")
    rig.slot.tell("dropped")
    assert rig.slot.held == ()


def test_a_restarted_supervisor_asks_the_router_to_restore(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.sqlite3")
    rig = Rig(store, first_start=False)
    assert rig.router.expect(RestoreQuestions) == RestoreQuestions()
    rig.ref.stop()
    store.shutdown()


def test_the_error_a_poison_questions_asker_reads_is_kept_to_500_characters() -> None:
    from coms_hermes_bridge.actors.question_supervisor import failed_error

    prefix = "bridge failed on this question: "
    assert failed_error("e" * 500) == prefix + "e" * 500  # at the limit: whole
    assert failed_error("e" * 501) == prefix + "e" * 499 + "…"  # past it: 500 in all


def test_each_question_has_an_intensity_of_its_own(rig: Rig) -> None:
    # another question's crashes do not count toward this one's bound
    other_qid = "01HZY3K4M5N6P7Q8R9S0T1V2W4"
    other_child = f"question:{other_qid}:run.1"
    other_prompt = PROMPT.model_copy(update={"msg_id": other_qid})
    spec = QuestionSpec(other_qid, other_prompt, parse_prompt(other_prompt), 60_000,
                        time.time() + 60)
    rig.store.put_open(spec, owner=other_child)
    other = Slot(other_child)
    rig.ref.tell(StartQuestion(spec, other_child, other))
    wait_for(lambda: other.ref, what="the other question started")
    for slot in (rig.slot, other, rig.slot, other, rig.slot, other):  # 3 crashes each
        before = slot.ref
        slot.tell(Boom())
        wait_for(lambda slot=slot, before=before: slot.ref not in (None, before),
                 what="restarted")
    assert rig.peer.seen == []  # neither is poison: 3 crashes each, within each bound
    assert rig.ref.is_alive()


def test_a_stopping_supervisor_stops_its_questions(rig: Rig) -> None:
    question = rig.slot.ref
    assert question is not None
    rig.ref.stop(timeout=5)
    wait_for(lambda: not question.is_alive(), what="the question stopped with it")


def test_each_start_is_handed_the_questions_slot_and_the_supervisors_address(rig: Rig) -> None:
    before = rig.slot.ref
    rig.slot.tell(Boom())
    rig.restarted(before)
    me = rig.ref
    assert [(slot is rig.slot, sup == me) for slot, sup in rig.given] == [(True, True)] * 2


def test_the_address_questions_report_to_may_be_the_supervisors_slot(tmp_path: Path) -> None:
    # the tree hands its QuestionSupervisor a Slot: a restarted supervisor keeps the address
    store = Store.open(tmp_path / "s.sqlite3")
    me = FakeRef("questions' slot")
    rig = Rig(store, me=me)
    rig.start(QuestionSpec(QID, PROMPT, parse_prompt(PROMPT), 60_000, time.time() + 60))
    assert [sup for _slot, sup in rig.given] == [me]
    pykka.ActorRegistry.stop_all()
    store.shutdown()

def test_a_question_that_cannot_start_is_restarted_then_given_up_with_its_error(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    # as if it had crashed at once: counted, and past its bound the asker is told why
    rig.fails.extend(ValueError("bad spec") for _ in range(10))
    before = rig.slot.ref
    rig.slot.tell(Boom())
    owed = rig.peer.expect(SendResponse)
    assert owed == SendResponse(PROMPT, None, "bridge failed on this question: ValueError: bad spec",
                                CHILD)
    assert len(rig.given) == 1 + 3  # the first start, then three restarts, each failing
    assert before is not None and not before.is_alive()
    assert capsys.readouterr().err.splitlines() == [
        f"coms-hermes-bridge: warning: {CHILD} crashed (RuntimeError: boom); restarting it",
        f"coms-hermes-bridge: warning: {CHILD} crashed (ValueError: bad spec); restarting it",
        f"coms-hermes-bridge: warning: {CHILD} crashed (ValueError: bad spec); restarting it",
        f"coms-hermes-bridge: error: question {QID} crashed 4 times within 10s; "
        "closed it with an error (ValueError: bad spec)",
    ]


def test_a_question_with_no_thread_to_start_on_waits_out_a_backoff_with_its_mail(
    rig: Rig,
) -> None:
    rig.fails.append(RuntimeError("can't start new thread"))
    before = rig.slot.ref
    rig.slot.tell(Hold(release := threading.Event()))
    rig.slot.tell(Boom())
    rig.slot.tell("unread")
    release.set()
    wait_for(lambda: rig.schedule.delays, what="the start put off")
    assert rig.schedule.delays == [0.1]  # a shortage: backoff, not counted
    rig.schedule.fire()
    rig.restarted(before)
    assert rig.seen.next() == (1, "unread")


def test_a_poison_question_not_recorded_still_tells_its_asker(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def close(*args: Any, **kwargs: Any) -> bool:
        raise OSError("disk I/O error")

    monkeypatch.setattr(rig.store, "close", close)
    rig.fails.extend(ValueError("bad") for _ in range(10))
    rig.slot.tell(Boom())
    assert rig.peer.expect(SendResponse).error == "bridge failed on this question: ValueError: bad"
    assert rig.router.expect(QuestionRestarted) == QuestionRestarted(QID, CHILD)
    rig.sync()
    err = capsys.readouterr().err
    assert f"coms-hermes-bridge: could not record question {QID} as failed: " \
        "OSError('disk I/O error')\n" in err
    rig.logger.expect(LogEvent)


def test_a_closed_question_loses_its_put_off_restart(rig: Rig) -> None:
    rig.slot.tell(Short())
    wait_for(lambda: rig.schedule.delays, what="the restart put off")
    rig.ref.tell(QuestionClosed(QID, "cancelled", CHILD))
    rig.sync()
    assert rig.schedule.cancelled == [0]


def test_word_of_a_question_it_no_longer_runs_is_let_be(rig: Rig) -> None:
    rig.ref.tell(ResetQuestions())
    rig.ref.tell(QuestionClosed(QID, "answered", CHILD))  # the stopped question's last word
    rig.ref.tell(QuestionClosed(QID, "answered", "question:other:run.9"))
    rig.sync()
    assert rig.ref.is_alive()


def test_a_question_whose_row_is_gone_takes_no_more_mail(rig: Rig) -> None:
    rig.store.put_open(rig.specs[0], owner="question:someone-else")
    rig.slot.tell(Boom())
    rig.router.expect(QuestionClosed)
    rig.sync()
    rig.slot.tell("late")
    assert rig.slot.held == ()  # retired: nothing waits for a successor


def test_an_unknown_message_names_the_supervisor_and_the_message() -> None:
    rig = Rig(None)
    rig.ref.tell(("no", "such"))
    failed = rig.supervisor.next()
    assert failed.error == "UnknownMessage: questions does not take tuple: ('no', 'such')"
    pykka.ActorRegistry.stop_all()

def test_a_put_off_restart_that_came_is_not_cancelled_again_at_stop(rig: Rig) -> None:
    before = rig.slot.ref
    rig.slot.tell(Short())
    wait_for(lambda: rig.schedule.delays, what="the restart put off")
    rig.schedule.fire()
    rig.restarted(before)
    rig.ref.stop(block=True, timeout=5)
    assert rig.schedule.cancelled == []
