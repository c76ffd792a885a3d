"""The dispatcher: pooled pykka actors keep every promise a thread-per-actor gives."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import pykka
import pytest
from pykka._envelope import Envelope

from coms_hermes_bridge.actors.base import PooledChild
from coms_hermes_bridge.actors.dispatch import Dispatcher, PooledActor, PoolInbox, StopFlag
from coms_hermes_bridge.actors.edge import Edge
from coms_hermes_bridge.messages.commands import ChildFailed
from tests.fakes import FakeRef, thread_count, wait_for


def turns_over(ref: pykka.ActorRef[Any]) -> None:
    """Wait until no turn of `ref`'s actor runs or is due (white-box: its mailbox's
    flag, cleared only at the end of a turn that leaves it empty): whatever that
    actor's runtime does, teardown included, is done."""
    inbox = ref.actor_inbox
    assert isinstance(inbox, PoolInbox)
    wait_for(lambda: not inbox._scheduled, what="its last turn over")


class Recorder(PooledActor):
    """Records what it handles, with the thread and a concurrency check."""

    dispatcher = Dispatcher(Edge("test-dispatch"), "test-dispatch")

    def __init__(self, log: list[Any], busy: float = 0.0) -> None:
        super().__init__()
        self.log = log
        self.busy = busy
        self.inside = 0
        self.overlaps = 0
        self.threads: set[str] = set()
        self.events: list[str] = []

    def on_start(self) -> None:
        self.events.append("start")

    def on_stop(self) -> None:
        self.events.append("stop")
        self.log.append(("stopped", self.events))

    def on_receive(self, message: Any) -> Any:
        self.inside += 1
        if self.inside > 1:
            self.overlaps += 1
        self.threads.add(threading.current_thread().name)
        if self.busy:
            time.sleep(self.busy)
        self.events.append(f"msg:{message}")
        self.log.append(message)
        self.inside -= 1
        if message == "boom":
            raise ValueError("boom")
        return ("echo", message)

    def report(self) -> tuple[int, set[str], list[str]]:
        return self.overlaps, set(self.threads), list(self.events)


def test_messages_are_handled_in_mailbox_order_one_at_a_time() -> None:
    # ordering per actor, one turn at a time per actor
    logs: list[list[Any]] = [[] for _ in range(20)]
    refs = [Recorder.start(logs[i], busy=0.0005) for i in range(20)]
    senders = []
    for k in range(3):
        def send(k: int = k) -> None:
            for n in range(100):
                for ref in refs:
                    ref.tell((k, n))
        senders.append(threading.Thread(target=send))
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    wait_for(lambda: all(len(log) == 300 for log in logs), timeout=30, what="all handled")
    for ref, log in zip(refs, logs, strict=True):
        for k in range(3):
            assert [m for m in log if m[0] == k] == [(k, n) for n in range(100)]
        overlaps, threads, events = ref.proxy().report().get(timeout=5)
        assert overlaps == 0
        assert events[0] == "start"
        assert threads == {"test-dispatch"}  # 20 actors, their turns on the one loop thread


def test_ask_tell_stop_and_registry() -> None:
    log: list[Any] = []
    ref = Recorder.start(log)
    assert ref in pykka.ActorRegistry.get_by_class(Recorder)
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is ref
    ref.tell("a")
    assert ref.ask("b", timeout=5) == ("echo", "b")
    assert ref.proxy().on_receive("c").get(timeout=5) == ("echo", "c")
    assert ref.stop(timeout=5) is True
    assert not ref.is_alive()
    assert ref not in pykka.ActorRegistry.get_all()
    assert log[:3] == ["a", "b", "c"]
    assert log[3] == ("stopped", ["start", "msg:a", "msg:b", "msg:c", "stop"])
    with pytest.raises(pykka.ActorDeadError):
        ref.tell("late")
    assert ref.stop(timeout=5) is False  # already dead


def test_messages_told_before_stop_are_handled_then_later_asks_fail() -> None:
    log: list[Any] = []
    ref = Recorder.start(log, busy=0.01)
    for i in range(5):
        ref.tell(i)
    stopped = ref.stop(block=False)
    assert stopped.get(timeout=5) is True
    assert log[:5] == [0, 1, 2, 3, 4]
    # an ask that slipped into the mailbox after the stop gets ActorDeadError, not silence
    future = ref.actor_class._create_future()
    from pykka._envelope import Envelope

    ref.actor_inbox.put(Envelope("after", reply_to=future))
    with pytest.raises(pykka.ActorDeadError):
        future.get(timeout=5)


def test_an_ask_that_raises_goes_back_to_the_caller_and_the_actor_lives_on() -> None:
    log: list[Any] = []
    ref = Recorder.start(log)
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=5)
    assert ref.ask("next", timeout=5) == ("echo", "next")


class Failing(PooledActor):
    """Fails on 'boom'; its on_failure reads what is left in its mailbox (the hand-over)."""

    dispatcher = Dispatcher(Edge("test-failing"), "test-failing")

    def __init__(self, out: FakeRef, gate: threading.Event) -> None:
        super().__init__()
        self.out = out
        self.gate = gate

    def on_receive(self, message: Any) -> None:
        if message == "boom":
            self.gate.wait(5)  # let the test queue more mail behind the fatal message
            raise RuntimeError("boom")
        self.out.tell(("handled", message))

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        unread = []
        while not self.actor_inbox.empty():
            unread.append(self.actor_inbox.get().message)
        self.out.tell(("failed", str(exception_value), self.actor_stopped.is_set(), unread))

    def on_stop(self) -> None:
        self.out.tell("on_stop")


def test_on_failure_runs_once_dead_with_the_unread_mailbox_drainable() -> None:
    # as pykka's ThreadingActor: a tell that raises stops the actor (unregistered,
    # stopped) and calls on_failure, not on_stop; the unread mail can be handed over
    out = FakeRef()
    gate = threading.Event()
    ref = Failing.start(out, gate)
    ref.tell(1)
    ref.tell("boom")
    assert out.next() == ("handled", 1)
    ref.tell(2)
    ref.tell(3)
    gate.set()
    assert out.next() == ("failed", "boom", True, [2, 3])
    turns_over(ref)
    out.assert_nothing()  # no on_stop, nothing handled after the failure
    assert not ref.is_alive()
    assert ref not in pykka.ActorRegistry.get_all()


class FailsToStart(PooledActor):
    dispatcher = Dispatcher(Edge("test-start"), "test-start")

    def __init__(self, out: FakeRef) -> None:
        super().__init__()
        self.out = out

    def on_start(self) -> None:
        raise RuntimeError("no start")

    def on_receive(self, message: Any) -> None:
        self.out.tell(message)


def test_on_start_failure_stops_the_actor_before_any_message() -> None:
    out = FakeRef()
    hold = threading.Event()
    FailsToStart.dispatcher.edge.call(hold.wait, 5)  # the message is queued before on_start
    try:
        ref = FailsToStart.start(out)
        ref.tell("never")
    finally:
        hold.set()
    wait_for(lambda: not ref.is_alive(), what="stopped")
    turns_over(ref)
    out.assert_nothing()


class PooledQuestion(PooledChild):
    """A supervised pooled actor, as the QuestionActors are."""

    dispatcher = Dispatcher(Edge("test-child"), "test-child")

    def __init__(self, name: str, supervisor: FakeRef, gate: threading.Event) -> None:
        super().__init__(name, supervisor)
        self.gate = gate
        self.released = 0

    def release(self) -> None:
        self.released += 1

    def on_receive(self, message: Any) -> None:
        if message == "boom":
            self.gate.wait(5)
            raise RuntimeError("boom")


def test_a_pooled_child_hands_its_unread_mailbox_to_its_supervisor() -> None:
    supervisor = FakeRef("supervisor")
    gate = threading.Event()
    ref = PooledQuestion.start("q.1", supervisor, gate)
    ref.tell("boom")
    ref.tell("x")
    ref.tell("y")
    gate.set()
    failed = supervisor.expect(ChildFailed)
    assert failed.child == "q.1"
    assert failed.error == "RuntimeError: boom"
    assert failed.unread == ("x", "y")


def test_thread_count_stays_flat_with_thousands_of_actors() -> None:
    # 3,000 live actors, each handling mail, on the same few threads
    before = thread_count()
    logs: list[list[Any]] = [[] for _ in range(3000)]
    refs = [Recorder.start(log) for log in logs]
    for ref in refs:
        ref.tell("hello")
    wait_for(lambda: all(log == ["hello"] for log in logs), timeout=30, what="all handled")
    assert thread_count() <= before + 1  # the loop thread, if it was not up yet
    for ref in refs:
        ref.stop(block=False)
    wait_for(lambda: not any(ref.is_alive() for ref in refs), timeout=30, what="all stopped")


def test_a_busy_actor_does_not_starve_the_others() -> None:
    # a turn handles at most `throughput` messages, then the thread serves other actors
    class Single(Recorder):
        dispatcher = Dispatcher(Edge("test-single"), "test-single")
        throughput = 2

    busy_log: list[Any] = []
    busy = Single.start(busy_log, busy=0.002)
    for i in range(200):
        busy.tell(i)
    other_log: list[Any] = []
    other = Single.start(other_log)
    other.tell("me")
    wait_for(lambda: other_log == ["me"], what="the other actor's turn")
    assert len(busy_log) < 200
    wait_for(lambda: len(busy_log) == 200, timeout=10, what="the busy actor done")


def test_the_inbox_is_pykkas_mailbox_protocol() -> None:
    inbox = PoolInbox()
    assert inbox.empty()
    with pytest.raises(IndexError, match=r"^get from an empty mailbox$"):
        inbox.get()


class _Submits:
    """A dispatcher that records the turns asked of it and runs none."""

    def __init__(self) -> None:
        self.turns: list[PoolInbox] = []

    def submit(self, inbox: PoolInbox) -> None:
        self.turns.append(inbox)


class _Reads:
    """What a mailbox's turn calls on its actor: here, read `per_turn` messages."""

    def __init__(self, inbox: PoolInbox, per_turn: int) -> None:
        self.inbox, self.per_turn = inbox, per_turn
        self.read: list[Any] = []

    def _turn(self) -> None:
        for _ in range(self.per_turn):
            envelope = self.inbox.take()
            if envelope is not None:
                self.read.append(envelope.message)


def test_a_mailbox_asks_for_one_turn_at_a_time() -> None:
    # one turn at a time per actor: a turn is asked for when mail comes to an idle
    # mailbox, never while one is due, and again after a turn that left mail
    inbox, dispatcher = PoolInbox(), _Submits()
    inbox.put(Envelope("early"))  # before the actor runs: held, no turn asked for
    assert inbox.qsize() == 1
    actor = _Reads(inbox, per_turn=2)
    inbox.attach(actor, dispatcher)  # type: ignore[arg-type]
    assert dispatcher.turns == [inbox]  # the first turn (on_start, then the mail)
    inbox.put(Envelope("a"))
    inbox.put(Envelope("b"))
    assert dispatcher.turns == [inbox] and inbox.qsize() == 3  # that turn is still due
    inbox.run_turn()  # reads two, leaves one: asks for the next turn itself
    assert actor.read == ["early", "a"] and dispatcher.turns == [inbox, inbox]
    inbox.put(Envelope("c"))
    assert dispatcher.turns == [inbox, inbox]
    inbox.run_turn()  # reads the last two: idle
    assert actor.read == ["early", "a", "b", "c"] and inbox.qsize() == 0
    assert dispatcher.turns == [inbox, inbox]
    inbox.put(Envelope("d"))  # mail to an idle mailbox: one turn more
    inbox.put(Envelope("e"))  # and that turn is due: no other
    assert dispatcher.turns == [inbox, inbox, inbox]


def test_a_stop_flag_is_an_events_interface() -> None:
    # is_set, set, clear and wait as threading.Event has them, the event made on demand
    flag = StopFlag()
    assert flag.is_set() is False
    flag.clear()  # nobody waits yet: no event to clear
    flag.set()
    assert flag.is_set() is True
    flag.clear()
    assert flag.is_set() is False
    assert flag.wait(0) is False  # a waiter: its event is made
    flag.set()
    assert flag.wait(0) is True
    flag.clear()
    assert flag.is_set() is False and flag.wait(0) is False  # its event cleared too


class _Fatal(BaseException):
    """Not an Exception: as for SystemExit, pykka stops every actor."""


class _Doomed(PooledActor):
    dispatcher = Recorder.dispatcher

    def on_receive(self, message: Any) -> Any:
        raise _Fatal(message)


def test_a_base_exception_stops_every_actor_without_blocking_the_pool() -> None:
    # the stops are asked for, not waited for: the other actor's stop runs on this
    # same loop, after the turn that asked for it
    log: list[Any] = []
    other = Recorder.start(log)
    doomed = _Doomed.start()
    doomed.tell("fatal")
    wait_for(lambda: not doomed.is_alive() and not other.is_alive(), what="every actor stopped")
    turns_over(other)
    assert log == [("stopped", ["start", "stop"])]


def test_a_stopped_pooled_actor_wakes_whoever_waits_for_its_stop() -> None:
    # pykka's `actor_stopped` keeps its Event interface (is_set, wait) on a pooled actor
    ref = Recorder.start([])
    assert isinstance(ref.actor_stopped, StopFlag) and ref.is_alive()
    assert not ref.actor_stopped.wait(0.01)
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(ref.actor_stopped.wait(5)))
    waiter.start()
    ref.stop()
    waiter.join(5)
    assert woken == [True]
    assert ref.actor_stopped.is_set() and not ref.is_alive()
    assert ref.actor_stopped.wait(0)  # set already: at once


def test_an_idle_mailbox_holds_no_queue() -> None:
    # thousands of idle questions must not each keep an empty deque
    log: list[Any] = []
    ref = Recorder.start(log)
    inbox = ref.actor_inbox
    assert isinstance(inbox, PoolInbox)
    for n in range(5):
        ref.tell(n)
    wait_for(lambda: log == [0, 1, 2, 3, 4], what="all five")
    wait_for(lambda: inbox.qsize() == 0, what="read")
    assert inbox._queue is None and inbox.empty()
    ref.tell("again")  # and mail still comes through
    wait_for(lambda: log[-1] == "again", what="the sixth")
    with pytest.raises(IndexError):
        wait_for(lambda: inbox._queue is None, what="read")
        inbox.get()
    ref.stop()


def test_a_dispatcher_runs_turns_on_its_edges_thread_and_survives_a_faulty_one(
    capfd: pytest.CaptureFixture[str],
) -> None:
    edge = Edge("test-turns")
    dispatcher = Dispatcher(edge, "turns")
    assert Dispatcher(edge).name == "actors"  # what its lines say when it is given no name
    ran: list[str] = []

    class Inbox:  # what the dispatcher calls on a mailbox, and no more
        def run_turn(self) -> None:
            ran.append(threading.current_thread().name)

    class Broken:
        def run_turn(self) -> None:
            raise RuntimeError("broken turn")

    dispatcher.submit(Broken())  # type: ignore[arg-type]
    dispatcher.submit(Inbox())  # type: ignore[arg-type]
    wait_for(lambda: len(ran) == 1, what="the turn")
    assert ran == ["test-turns"]  # SIGUSR1's stack dump shows this name
    assert ("coms-hermes-bridge: turns: a turn failed outside its actor: "
            "RuntimeError('broken turn')") in capfd.readouterr().err
    edge.close()
