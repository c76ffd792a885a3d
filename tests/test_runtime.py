"""The actor runtime: the edge's loop, its timers and processes, the pooled actors whose
turns run on it, and the supervision plumbing (slots, a dying child's mailbox).

The restart policy (Intensity, RestartPolicy) is tested in test_supervision.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import pykka
import pytest
from pykka._envelope import Envelope

from coms_hermes_bridge.actors.loop import Edge, StopFlag, awaited, shared_edge
from coms_hermes_bridge.actors.supervision import PooledChild, Slot
from coms_hermes_bridge.actors.turns import PooledActor, PoolInbox
from coms_hermes_bridge.messages.commands import ChildFailed
from tests.fakes import FakeRef, close_edge, handled, thread_count, wait_for

ACTORS = Edge("test-actors")  # every pooled actor of this file turns on it; never closed, as
# the shared one (a closed edge stays closed, and this module may run twice in a process)


def queued(inbox: PoolInbox) -> int:
    """How many messages wait in the mailbox (white-box: the runtime never asks)."""
    return len(inbox._queue or ())


@pytest.fixture
def edge() -> Iterator[Edge]:
    own = Edge("test-edge")
    yield own
    close_edge(own)


def after(edge: Edge, delay: float, fn: Callable[..., object], *args: Any) -> None:
    """`fn(*args)` on `edge`'s loop `delay` seconds after the loop gets to this call."""
    edge.call(edge.loop.call_later, delay, fn, *args)


def later(delay: float, fn: Callable[[], object]) -> None:
    """`fn()` on the shared edge's loop `delay` seconds after the loop gets to this call."""
    after(shared_edge(), delay, fn)


def passed(edge: Edge, delay: float = 0.0) -> None:
    """Every call made to `edge` before this one has run, and every timer set before it
    that is due within `delay` seconds has fired (timers fire in deadline order)."""
    done = threading.Event()
    after(edge, delay, done.set)
    assert done.wait(delay + 10), "the edge's loop stalled"


# -- the loop and its timers ----------------------------------------------------------


def test_a_timer_fires_after_its_delay_and_never_before() -> None:
    # C17: a question's deadline, its stored wall time turned into a delay
    began = time.monotonic()
    fired: list[float] = []
    later(0.3, lambda: fired.append(time.monotonic()))
    wait_for(lambda: fired, what="the timer fired")
    assert fired[0] - began >= 0.3


def test_timers_fire_in_deadline_order_whatever_the_order_set() -> None:
    # a deadline already past (a negative delay) fires at once; a far one does not hold
    # up an earlier one set after it
    order: list[str] = []
    for name, delay in [("c", 0.3), ("a", 0.1), ("never", 3600), ("b", 0.2), ("past", -5),
                        ("d", 0.4)]:
        later(delay, functools.partial(order.append, name))
    passed(shared_edge(), 0.5)
    assert order == ["past", "a", "b", "c", "d"]


def test_ten_thousand_timers_one_thread() -> None:
    shared = shared_edge()
    passed(shared)  # its thread is running
    before = threading.active_count()
    fired: list[int] = []
    hold = threading.Event()
    shared.call(hold.wait, 30)  # the loop waits while the timers are set
    for i in range(10_000):
        later((i % 50) / 1000, functools.partial(fired.append, i))
    assert threading.active_count() == before  # the loop's thread, nothing per timer
    hold.set()
    passed(shared, 0.1)
    assert sorted(fired) == list(range(10_000))


def test_the_shared_edge_runs_on_the_thread_named_edge() -> None:
    ran_on: list[str] = []
    later(0.1, lambda: ran_on.append(threading.current_thread().name))
    shared = shared_edge()
    passed(shared, 0.2)
    assert ran_on == ["edge"]
    assert shared is shared_edge() and shared.name == "edge"
    made = Edge()  # (made here, for mutation testing to see this test make one)
    assert made.name == "edge"
    close_edge(made)
    assert shared._thread is not None and shared._thread.daemon


def test_the_shared_edge_never_holds_the_process_up() -> None:
    # docs/architecture.md names the daemon's threads; a process that is done exits
    # without closing the edge (a non-daemon loop thread would keep it alive forever)
    code = ("import threading\n"
            "from coms_hermes_bridge.actors.loop import shared_edge\n"
            "edge = shared_edge()\n"
            "done = threading.Event()\n"
            "edge.call(done.set)\n"
            "assert done.wait(5)\n"
            "print(sorted(t.name for t in threading.enumerate()))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "['MainThread', 'edge']\n"


def test_calls_from_any_thread_run_on_the_loop_in_order(edge: Edge) -> None:
    seen: list[tuple[int, bool]] = []
    for i in range(100):
        edge.call(lambda i=i: seen.append((i, edge.on_loop())))
    edge.call(lambda: edge.call(seen.append, (100, edge.on_loop())))  # and from the loop's own
    passed(edge)
    assert seen == [(i, True) for i in range(101)]
    assert not edge.on_loop()


def test_a_fault_in_a_callback_is_one_line_on_stderr_and_the_loop_goes_on(
    edge: Edge, capfd: pytest.CaptureFixture[str]
) -> None:
    seen: list[int] = []

    def bad_call() -> None:
        raise RuntimeError("bad call")

    def bad_action() -> None:
        raise RuntimeError("bad action")

    def lost() -> None:  # what asyncio itself finds with nobody to see it
        edge.loop.call_exception_handler({"message": "lost task", "exception": ValueError("v")})
        edge.loop.call_exception_handler({"message": "no exception"})

    edge.call(seen.append, 1)
    edge.call(bad_call)
    edge.call(seen.append, 2)
    after(edge, 0.01, bad_action)
    after(edge, 0.02, seen.append, 3)
    passed(edge, 0.03)
    edge.call(lost)
    passed(edge)
    assert seen == [1, 2, 3]
    def source(fn: Callable[[], None]) -> str:
        return f"{fn.__qualname__}() at {__file__}:{fn.__code__.co_firstlineno}"

    assert capfd.readouterr().err.splitlines() == [
        f"coms-hermes-bridge: test-edge: Exception in callback {source(bad_call)}: "
        "RuntimeError('bad call')",
        f"coms-hermes-bridge: test-edge: Exception in callback {source(bad_action)}: "
        "RuntimeError('bad action')",
        "coms-hermes-bridge: test-edge: lost task: ValueError('v')",
        "coms-hermes-bridge: test-edge: no exception",
    ]


def test_an_edge_runs_its_loop_on_a_daemon_thread_of_its_name_until_closed() -> None:
    own = Edge("test-close")
    ran = threading.Event()
    own.call(ran.set)
    assert ran.wait(5)
    thread, loop = own._thread, own.loop
    assert thread.name == "test-close" and thread.daemon  # never holds the process up
    close_edge(own)
    assert not thread.is_alive() and loop.is_closed()
    close_edge(own)  # twice is harmless


def test_spawn_from_the_loop_is_a_task_at_once_and_from_elsewhere_a_threadsafe_future(
    edge: Edge,
) -> None:
    # from the loop (every actor's turn), no hand-over between threads: the task exists
    # before the spawning callback returns, and the next callback finds it running
    async def value(v: str) -> str:
        return v

    seen: list[object] = []

    def from_the_loop() -> None:
        task = edge.spawn(value("on"))
        seen.append(task)
        edge.loop.call_soon(lambda: seen.append(task.done()))

    edge.call(from_the_loop)
    passed(edge)
    task = seen[0]
    assert isinstance(task, asyncio.Task) and task.result() == "on"
    assert seen[1] is True  # ran before the callback queued after it
    off = edge.spawn(value("off"))
    assert isinstance(off, concurrent.futures.Future) and off.result(5) == "off"


def test_awaited_hands_out_a_reply_callback_and_waits_on_the_loop(edge: Edge) -> None:
    # how an actor answers the edge: no thread blocks in an ask
    def at_once(reply: Callable[[int], None]) -> None:
        reply(7)

    def twice(reply: Callable[[str], None]) -> None:
        reply("first")
        reply("second")

    def never(reply: Callable[[str], None]) -> None:
        pass

    assert edge.spawn(awaited(at_once, 5)).result(5) == 7
    assert edge.spawn(awaited(twice, 5)).result(5) == "first"  # at most once used
    waiting = edge.spawn(awaited(never, 0.05))
    with pytest.raises(TimeoutError):
        waiting.result(2)
    assert waiting.done()  # it gave up by itself after 0.05 s, not this wait after 2 s


def test_a_reply_after_the_loop_closed_is_dropped_quietly() -> None:
    own = Edge("test-edge-closing")
    replies: list[Callable[[int], None]] = []
    waiting = own.spawn(awaited(replies.append, 30))
    wait_for(lambda: replies, what="the reply callback handed out")
    waiting.cancel()  # its caller gave up
    passed(own)
    close_edge(own)
    replies[0](1)  # nobody waits any more: no error


# -- pooled actors: turns on the loop ---------------------------------------------------


def turns_over(ref: pykka.ActorRef[Any]) -> None:
    """Wait until no turn of `ref`'s actor runs or is due (white-box: its mailbox's
    flag, cleared only at the end of a turn that leaves it empty): whatever that
    actor's runtime does, teardown included, is done."""
    inbox = ref.actor_inbox
    assert isinstance(inbox, PoolInbox)
    wait_for(lambda: not inbox._scheduled, what="its last turn over")


class Recorder(PooledActor):
    """Appends what it handles to `log`, and checks its turns never overlap."""

    edge = ACTORS

    def __init__(self, log: list[Any]) -> None:
        super().__init__()
        self.log = log
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
        self.events.append(f"msg:{message}")
        self.log.append(message)
        self.inside -= 1
        if message == "boom":
            raise ValueError("boom")
        return ("echo", message)

    def report(self) -> tuple[int, set[str], list[str]]:
        return self.overlaps, set(self.threads), list(self.events)


def test_messages_are_handled_in_mailbox_order_one_at_a_time() -> None:
    # ordering per actor, one turn at a time per actor, from many telling threads
    logs: list[list[Any]] = [[] for _ in range(20)]
    refs = [Recorder.start(logs[i]) for i in range(20)]
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
        assert threads == {"test-actors"}  # 20 actors, their turns on the one loop thread


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
    hold = threading.Event()
    ACTORS.call(hold.wait, 5)  # the tells and the stop are all queued before any turn
    try:
        ref = Recorder.start(log)
        for i in range(5):
            ref.tell(i)
        stopped = ref.stop(block=False)
    finally:
        hold.set()
    assert stopped.get(timeout=5) is True
    assert log == [0, 1, 2, 3, 4, ("stopped", ["start", *(f"msg:{i}" for i in range(5)), "stop"])]
    # an ask that slipped into the mailbox after the stop gets ActorDeadError, not silence
    future = ref.actor_class._create_future()
    ref.actor_inbox.put(Envelope("after", reply_to=future))
    with pytest.raises(pykka.ActorDeadError):
        future.get(timeout=5)


def test_an_ask_that_raises_goes_back_to_the_caller_and_the_actor_lives_on() -> None:
    ref = Recorder.start([])
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom", timeout=5)
    assert ref.ask("next", timeout=5) == ("echo", "next")


def test_a_busy_actor_does_not_starve_the_others() -> None:
    # a turn handles at most `throughput` messages, then the loop serves other actors
    class Two(Recorder):
        throughput = 2

    log: list[Any] = []
    hold = threading.Event()
    ACTORS.call(hold.wait, 5)  # both actors' mail is in before either has a turn
    try:
        busy = Two.start(log)
        for i in range(200):
            busy.tell(i)
        other = Two.start(log)
        other.tell("me")
    finally:
        hold.set()
    wait_for(lambda: len(log) == 201, timeout=10, what="all handled")
    assert log[:4] == [0, 1, "me", 2]  # the other's turn came after the busy one's first


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


def test_an_idle_mailbox_holds_no_queue() -> None:
    # RSS at --max-open: an idle question's mailbox keeps no empty deque
    log: list[Any] = []
    ref = Recorder.start(log)
    inbox = ref.actor_inbox
    assert isinstance(inbox, PoolInbox)
    for n in range(5):
        ref.tell(n)
    wait_for(lambda: log == [0, 1, 2, 3, 4], what="all five")
    turns_over(ref)
    assert inbox._queue is None and inbox.empty() and queued(inbox) == 0
    ref.tell("again")  # and mail still comes through
    wait_for(lambda: log[-1] == "again", what="the sixth")
    turns_over(ref)
    assert inbox._queue is None


def test_the_inbox_is_pykkas_mailbox_protocol() -> None:
    # put, empty and get, as pykka's teardown drains a mailbox: get after empty() says no
    inbox = PoolInbox()
    assert inbox.empty()
    first, second = Envelope("first"), Envelope("second")
    inbox.put(first)
    inbox.put(second)
    drained = []
    while not inbox.empty():
        drained.append(inbox.get())
    assert drained == [first, second] and inbox.empty()


class _Calls:
    """An edge that records the calls asked of it and runs none."""

    name = "recorded"

    def __init__(self) -> None:
        self.calls: list[Callable[..., object]] = []

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        self.calls.append(fn)


class _Reads:
    """What a mailbox's turn calls on its actor: here, read `per_turn` messages."""

    def __init__(self, inbox: PoolInbox, per_turn: int) -> None:
        self.inbox, self.per_turn = inbox, per_turn
        self.read: list[Any] = []

    def _turn(self) -> None:
        for _ in range(self.per_turn):
            envelope = self.inbox.get()
            if envelope is not None:
                self.read.append(envelope.message)


def test_a_mailbox_asks_for_one_turn_at_a_time() -> None:
    # one turn at a time per actor: a turn is asked for when mail comes to an idle
    # mailbox, never while one is due, and again after a turn that left mail
    inbox, edge = PoolInbox(), _Calls()
    inbox.put(Envelope("early"))  # before the actor runs: held, no turn asked for
    assert queued(inbox) == 1
    actor = _Reads(inbox, per_turn=2)
    inbox.attach(actor, edge)  # type: ignore[arg-type]
    assert edge.calls == [inbox.run_turn]  # the first turn (on_start, then the mail)
    inbox.put(Envelope("a"))
    inbox.put(Envelope("b"))
    assert edge.calls == [inbox.run_turn] and queued(inbox) == 3  # that turn is still due
    inbox.run_turn()  # reads two, leaves one: asks for the next turn itself
    assert actor.read == ["early", "a"] and edge.calls == [inbox.run_turn] * 2
    inbox.put(Envelope("c"))
    assert edge.calls == [inbox.run_turn] * 2
    inbox.run_turn()  # reads the last two: idle
    assert actor.read == ["early", "a", "b", "c"] and queued(inbox) == 0
    assert edge.calls == [inbox.run_turn] * 2
    inbox.put(Envelope("d"))  # mail to an idle mailbox: one turn more
    inbox.put(Envelope("e"))  # and that turn is due: no other
    assert edge.calls == [inbox.run_turn] * 3


def test_a_turn_that_fails_outside_its_actor_is_one_line_and_the_loop_goes_on(
    edge: Edge, capfd: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    class Broken:
        def _turn(self) -> None:
            raise RuntimeError("broken turn")

    class Works:
        def _turn(self) -> None:
            ran.append(threading.current_thread().name)

    broken, works = PoolInbox(), PoolInbox()
    broken.attach(Broken(), edge)  # type: ignore[arg-type]
    works.attach(Works(), edge)  # type: ignore[arg-type]
    passed(edge)
    assert ran == ["test-edge"]  # the thread carries the edge's name
    assert capfd.readouterr().err.splitlines() == [
        "coms-hermes-bridge: test-edge: a turn failed outside its actor: "
        "RuntimeError('broken turn')"]


def test_a_turn_that_fails_outside_its_actor_is_not_tried_again_until_mail_comes(
    capfd: pytest.CaptureFixture[str]
) -> None:
    # a broken turn that leaves mail must not spin the loop (and flood stderr)
    class Broken:
        def _turn(self) -> None:
            raise RuntimeError("broken turn")

    inbox, edge = PoolInbox(), _Calls()
    inbox.put(Envelope("left"))
    inbox.attach(Broken(), edge)  # type: ignore[arg-type]
    inbox.run_turn()
    assert edge.calls == [inbox.run_turn] and queued(inbox) == 1  # no turn queued again
    inbox.put(Envelope("more"))  # new mail: one more try
    assert edge.calls == [inbox.run_turn] * 2
    assert capfd.readouterr().err.count("a turn failed outside its actor") == 1


class Failing(PooledActor):
    """Fails on 'boom'; its on_failure reads what is left in its mailbox (the hand-over)."""

    edge = ACTORS

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
    # stopped) and calls on_failure, not on_stop, with the unread mail still drainable
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
    edge = ACTORS

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
    ACTORS.call(hold.wait, 5)  # the message is queued before on_start
    try:
        ref = FailsToStart.start(out)
        ref.tell("never")
    finally:
        hold.set()
    wait_for(lambda: not ref.is_alive(), what="stopped")
    turns_over(ref)
    out.assert_nothing()


class _Refuses:
    """An edge that cannot take a call: its loop is gone, say."""

    name = "refuses"

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        raise RuntimeError("Event loop is closed")


class NeverRuns(PooledActor):
    edge = _Refuses()  # type: ignore[assignment]


def test_an_actor_that_cannot_be_given_a_turn_is_not_left_registered() -> None:
    before = pykka.ActorRegistry.get_all()
    with pytest.raises(RuntimeError, match=r"^Event loop is closed$"):
        NeverRuns.start()
    assert pykka.ActorRegistry.get_all() == before  # nothing for stop_all to wait on


class _Fatal(BaseException):
    """Not an Exception: as for SystemExit, pykka stops every actor."""


class _Doomed(PooledActor):
    edge = ACTORS

    def on_receive(self, message: Any) -> Any:
        raise _Fatal(message)


def test_a_base_exception_stops_every_actor_without_blocking_the_loop() -> None:
    # the stops are asked for, not waited for: the other actor's stop runs on this
    # same loop, after the turn that asked for it
    log: list[Any] = []
    other = Recorder.start(log)
    doomed = _Doomed.start()
    doomed.tell("fatal")
    wait_for(lambda: not doomed.is_alive() and not other.is_alive(), what="every actor stopped")
    turns_over(other)
    assert log == [("stopped", ["start", "stop"])]


def test_a_stop_flag_is_as_much_of_an_event_as_pykka_uses() -> None:
    # is_set and set, as threading.Event has them (pykka 4.1-4.5 calls nothing else)
    flag = StopFlag()
    assert flag.is_set() is False
    flag.set()
    assert flag.is_set() is True


def test_a_blocking_stop_of_a_pooled_actor_returns_once_it_stopped() -> None:
    # as the root stops its children: pykka waits on the stop's future, never on the flag
    ref = Recorder.start([])
    assert isinstance(ref.actor_stopped, StopFlag) and ref.is_alive()
    assert ref.stop(block=True, timeout=5) is True
    assert ref.actor_stopped.is_set() and not ref.is_alive()
    assert ref.stop(block=True, timeout=5) is False  # already gone: at once


class Ticker(PooledActor):
    """On "arm", sets its timers; forwards whatever else it reads to `out`."""

    edge = ACTORS

    def __init__(self, out: FakeRef) -> None:
        super().__init__()
        self.out = out

    def on_receive(self, message: Any) -> None:
        if message == "arm":
            self.tell_later(0.05, "tick")
            self.tell_later(0.01, "cancelled").cancel()
        elif message == "arm and stop":
            self.tell_later(0.05, "after its stop")
            self.stop()  # read in this same turn: it is dead when the timer fires
        else:
            self.out.tell((message, threading.current_thread().name))


def test_tell_later_tells_this_actor_on_the_loop(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # C17, X9: a question's own TimedOut and RemindDue are told to it later
    out = FakeRef("out")
    ref = Ticker.start(out)
    ref.tell("arm")
    assert out.next() == ("tick", "test-actors")
    handled(ref)
    out.assert_nothing()  # the cancelled one never came
    ref.tell("arm and stop")
    wait_for(lambda: not ref.is_alive(), what="stopped")
    passed(ACTORS, 0.1)  # its timer fired at a dead actor: dropped, no fault
    out.assert_nothing()
    assert capfd.readouterr().err == ""


def test_tell_later_is_for_a_turn_only() -> None:
    # its handle is the loop's, and only the loop may cancel it
    ref = Ticker.start(FakeRef("out"))
    actor = ref._actor_weakref()
    assert actor is not None
    with pytest.raises(AssertionError, match=r"^tell_later outside a turn$"):
        actor.tell_later(0, "from another thread")
    ref.stop()


# -- supervision plumbing: slots and a dying child's mailbox ---------------------------


class Worker(PooledChild):
    """A supervised pooled actor, as the daemon's are: `log` says what it began, released,
    handled and lost; it crashes on "boom" once `gate` opens."""

    edge = ACTORS

    def __init__(self, name: str, supervisor: FakeRef, *, log: list[Any],
                 gate: threading.Event | None = None, cannot_begin: bool = False) -> None:
        super().__init__(name, supervisor)
        self.log, self.gate = log, gate
        self.cannot_begin = cannot_begin

    def begin(self) -> None:
        self.log.append("begin")
        if self.cannot_begin:
            raise OSError(errno.EMFILE, "short")

    def release(self) -> None:
        self.log.append("release")

    def lost(self, message: Any) -> None:
        self.log.append(("lost", message))

    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            assert self.gate is not None
            self.gate.wait(5)  # let the test queue more mail behind the fatal message
            raise RuntimeError("boom")
        self.log.append(message)
        return message


def test_a_crashing_child_tells_its_supervisor_and_its_unread_mail_is_lost() -> None:
    # a restart is a start: nothing is handed over; a waiting ask fails, each told
    # message is shown to `lost` (who waits on it is answered), and a tell after the
    # crash is dropped until a successor is bound
    supervisor = FakeRef("supervisor")
    gate = threading.Event()
    log: list[Any] = []
    slot = Slot("q.1")
    ref = Worker.start("q.1", supervisor, log=log, gate=gate)
    slot.bind(ref)
    slot.tell("boom")
    slot.tell("x")
    asked = ref.ask("asked", block=False)
    slot.tell("y")
    gate.set()
    assert supervisor.expect(ChildFailed) == ChildFailed("q.1", "RuntimeError: boom")
    with pytest.raises(pykka.ActorDeadError, match=r"^q\.1$"):
        asked.get(timeout=5)
    slot.tell("after the crash")  # to a dead child: dropped, no raise
    turns_over(ref)
    assert log == ["begin", "release", ("lost", "x"), ("lost", "y")] and not ref.is_alive()
    supervisor.assert_nothing()
    successor = Worker.start("q.1", supervisor, log=log)
    slot.bind(successor)
    slot.tell("to the successor")
    handled(successor)
    assert log[-2:] == ["begin", "to the successor"]
    slot.retire()  # gone for good: what is told from now on is dropped
    slot.tell("dropped")
    assert slot.ref is None
    successor.stop()


def test_a_child_that_cannot_begin_fails_to_its_supervisor_before_any_message() -> None:
    # pykka stops an actor whose on_start raises without on_failure: Supervised says it
    supervisor = FakeRef("supervisor")
    log: list[Any] = []
    hold = threading.Event()
    ACTORS.call(hold.wait, 5)  # what is told is in the mailbox before on_start
    try:
        ref = Worker.start("q.2", supervisor, log=log, cannot_begin=True)
        ref.tell("told")
    finally:
        hold.set()
    failed = supervisor.expect(ChildFailed)
    assert failed == ChildFailed("q.2", "OSError: [Errno 24] short")
    turns_over(ref)
    assert log == ["begin", "release", ("lost", "told")]
    assert not ref.is_alive() and ref not in pykka.ActorRegistry.get_all()
    supervisor.assert_nothing()


def test_a_child_started_bound_gets_what_its_slot_was_told_before_its_first_turn() -> None:
    # the root binds a child's slot before the child's first turn: a tell from another
    # actor's turn in between waits in the mailbox, it is not dropped
    log: list[Any] = []
    slot = Slot("q.3")
    hold = threading.Event()
    ACTORS.call(hold.wait, 5)  # the child's first turn waits behind this
    try:
        ref = Worker.start_bound(slot.bind, "q.3", FakeRef("supervisor"), log=log)
        assert slot.ref is ref
        slot.tell("before its first turn")
    finally:
        hold.set()
    handled(ref)
    assert log == ["begin", "before its first turn"]
    ref.stop()
