"""Supervision promises with fake children: the root, slots, hand-over, backoff.

The children here are tiny actors that forward whatever they read to a FakeRef,
so a test sees exactly which messages each incarnation got, in which order. The
clock and the scheduler of delayed restarts are injected, so windows and
backoff are tested without waiting for them.
"""

from __future__ import annotations

import errno
import inspect
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pykka
import pytest

from coms_hermes_bridge.actors.delivery import DeliveryActor
from coms_hermes_bridge.actors.loop import (
    MAX_REPORT,
    Episode,
    is_resource_shortage,
    later,
    report,
    shared_edge,
    utc_now,
)
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.actors.supervision import Backoff, GiveUp, Intensity, RestartPolicy, Slot
from coms_hermes_bridge.actors.supervisor import ChildSpec, RootSupervisor, Wiring
from coms_hermes_bridge.messages.commands import (
    Address,
    ChildFailed,
    HermesRan,
    RestartChild,
    SendText,
)
from tests.fakes import (
    ROLES,
    ActorRig,
    Boom,
    Child,
    FakeClock,
    FakeRef,
    FakeSchedule,
    Hold,
    Recorder,
    Short,
    bridge_config,
    handled,
    wait_for,
)
from tests.hermes_fake import FakeHermes
from tests.test_question import question_spec

QID_A = "01HZY3K4M5N6P7Q8R9S0T1V2W3"
QID_B = "01HZY3K4M5N6P7Q8R9S0T1V2W4"


class Rig(ActorRig[RootSupervisor]):
    """A RootSupervisor of Recorder children, each telling its FakeRef in `seen` what
    it read; its clock and delayed restarts are the test's. `options` are the root's own."""

    def __init__(self, names: tuple[str, ...], **options: Any) -> None:
        self.slots = {n: Slot(n) for n in names}
        self.seen = {n: FakeRef(n) for n in names}
        self.clock, self.schedule = FakeClock(), FakeSchedule()
        self.fatal: list[str] = []
        specs = [ChildSpec(self.slots[n], self._starter(n)) for n in names]
        super().__init__(RootSupervisor, (), specs=specs, on_fatal=self.fatal.append,
                         clock=self.clock, schedule=self.schedule, **options)
        for slot in self.slots.values():
            wait_for(lambda s=slot: s.ref, what=f"{slot.name} started")  # type: ignore[misc]

    def _starter(self, name: str) -> Callable[[Address, int], pykka.ActorRef[Any]]:
        def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
            return Recorder.start(supervisor=sup, seen=self.seen[name], name=name, incarnation=n)
        return start

    def sync(self) -> None:
        """Returns once the root has handled everything told to it so far (a proxy's read
        is a message too): the ChildFailed of a child seen dead, say. A root that gave up
        and stopped handles nothing more."""
        try:
            handled(self.ref)
        except pykka.ActorDeadError:
            pass

    def crash(self, name: str, message: Any = None) -> None:
        """Crash `name` and wait for its next incarnation (or for the verdict)."""
        before = self.slots[name].ref
        self.slots[name].tell(message if message is not None else Boom())
        wait_for(lambda: self.slots[name].ref not in (None, before) or self.fatal,
                 what=f"{name} restarted")


@pytest.fixture
def rig() -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(
        names: tuple[str, ...] = ("a", "b"),
        max_restarts: int = 3,
        window_s: float = 10.0,
    ) -> Rig:
        rigs.append(Rig(names, max_restarts=max_restarts, window_s=window_s))
        return rigs[-1]

    yield make
    for made in rigs:
        try:
            made.ref.stop(block=True, timeout=2)
        except (pykka.ActorDeadError, pykka.Timeout):
            pass
    pykka.ActorRegistry.stop_all()


def _held_then_crash(rig: Rig, name: str, unread: list[Any], crash: Any = None) -> None:
    """Leave `unread` in `name`'s mailbox behind a crash, then let it crash."""
    release = threading.Event()
    before = rig.slots[name].ref
    rig.slots[name].tell(Hold(release))
    rig.slots[name].tell(crash if crash is not None else Boom())
    for message in unread:
        rig.slots[name].tell(message)
    release.set()
    wait_for(lambda: rig.slots[name].ref not in (None, before), what=f"{name} restarted")


# -- pure parts ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "shortage"),
    [
        (OSError(errno.EMFILE, "Too many open files"), True),
        (OSError(errno.ENFILE, "File table overflow"), True),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), True),
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (MemoryError(), True),
        (RuntimeError("can't start new thread"), True),
        (OSError(errno.ENOENT, "No such file"), False),
        (OSError(errno.EACCES, "Permission denied"), False),
        (RuntimeError("boom"), False),
        (ValueError("bad"), False),
        (None, False),
    ],
)
def test_resource_shortages_are_told_from_bugs(exc: BaseException | None, shortage: bool) -> None:
    # which crashes back off instead of counting toward the bound
    assert is_resource_shortage(exc) is shortage


def test_a_shortage_wrapped_in_another_error_is_still_a_shortage() -> None:
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as inner:
            raise RuntimeError("cannot write the registry entry") from inner
    except RuntimeError as outer:
        assert is_resource_shortage(outer)


def test_intensity_window_expires() -> None:
    # OTP's MaxR in MaxT: the 4th restart within 10 s is one too many, but
    # restarts older than the window no longer count
    clock = FakeClock()
    intensity = Intensity(3, 10.0, clock)
    assert [intensity.allow("a") for _ in range(3)] == [True, True, True]
    clock.now += 9.9
    assert not intensity.allow("a")
    clock.now += 10.0  # all four are older than the window: room for three again
    assert [intensity.allow("a") for _ in range(4)] == [True, True, True, False]


def test_intensity_window_boundary_and_verdict() -> None:
    clock = FakeClock()
    intensity = Intensity(1, 10.0, clock)
    assert intensity.allow("a")
    clock.now += 10.0  # exactly one window later: the old restart has left it
    assert intensity.allow("b")
    assert not intensity.allow("b")
    assert intensity.verdict() == "b crashed 2 times within 10s"
    clock.now += 5
    assert not intensity.allow("a")
    assert intensity.verdict() == "3 crashes within 10s (a, b; last a)"


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_quiet_spell() -> None:
    clock = FakeClock()
    backoff = Backoff(clock)
    delays = []
    for _ in range(12):
        delay, fresh = backoff.next("a")
        delays.append((delay, fresh))
        clock.now += delay
    assert delays[:4] == [(0.1, True), (0.2, False), (0.4, False), (0.8, False)]
    assert delays[-1] == (30.0, False) and all(d <= 30.0 for d, _ in delays)
    assert backoff.next("b") == (0.1, True)  # per child
    clock.now += 30.0 + 30.0 + 0.001  # quiet for longer than its delay plus the cap
    assert backoff.next("a") == (0.1, True)


# -- slots ---------------------------------------------------------------------


def test_bind_replays_unread_then_held_in_order(rig: Callable[..., Rig]) -> None:
    # what the dead child had not read comes first, then what was
    # told to the slot while it was down, each in the order it was told
    r = rig(("a",))
    seen = r.seen["a"]
    slot = Slot("x")
    slot.tell("held 1")
    slot.tell("held 2")
    ref = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=7)
    slot.bind(ref, ("unread 1", "unread 2"))
    slot.tell("after")
    got = [seen.next() for _ in range(5)]
    assert got == [(7, "unread 1"), (7, "unread 2"), (7, "held 1"), (7, "held 2"), (7, "after")]
    ref.stop()


def test_bind_to_a_dead_child_keeps_the_messages_held() -> None:
    # the child died before it was bound; nothing is lost, nothing raises,
    # and the rebind its ChildFailed brings delivers everything in order
    seen = FakeRef("seen")
    slot = Slot("x")
    dead = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=0)
    dead.stop()
    slot.tell("held")
    slot.bind(dead, ("unread",))
    slot.tell("later")
    assert slot._held == ["unread", "held", "later"]
    live = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=1)
    slot.bind(live)
    assert [seen.next() for _ in range(3)] == [(1, "unread"), (1, "held"), (1, "later")]
    assert not slot._held  # nothing waits any more
    live.stop()


def test_a_retired_slot_drops_and_a_detached_one_holds() -> None:
    seen = FakeRef("seen")
    slot = Slot("x")
    ref = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=0)
    slot.bind(ref)
    slot.detach(ref)  # what a dying child does before it drains its mailbox
    slot.tell("kept")
    assert slot._held == ["kept"] and slot.ref is None
    slot.retire()
    slot.tell("dropped")
    assert not slot._held
    ref.stop()


def test_a_slot_whose_child_died_holds_every_later_tell() -> None:
    # a tell to a child that died unbound goes to the held list, and so does the next
    seen = FakeRef("seen")
    slot = Slot("x")
    ref = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=0)
    slot.bind(ref)
    ref.stop()
    slot.tell("first")
    slot.tell("second")
    assert slot._held == ["first", "second"] and slot.ref is None


def test_detaching_a_slot_that_points_nowhere_changes_nothing() -> None:
    slot = Slot("x")
    ref = Recorder.start(supervisor=FakeRef(), seen=FakeRef("seen"), name="x", incarnation=0)
    slot.detach(ref)  # a child that dies before it was ever bound
    slot.tell("held")
    assert slot._held == ["held"] and slot.ref is None
    ref.stop()


def test_a_crashing_child_detaches_its_slot_before_handing_over() -> None:
    # a tell racing with the hand-over is held for the successor,
    # never put into the dead mailbox after it was drained
    supervisor = FakeRef("supervisor")
    seen = FakeRef("seen")
    slot = Slot("x")
    ref = Recorder.start(supervisor=supervisor, seen=seen, name="x", incarnation=0)
    slot.bind(ref)
    release = threading.Event()
    slot.tell(Hold(release))
    slot.tell(Boom())
    slot.tell("unread")
    release.set()
    failed = supervisor.expect(ChildFailed)
    assert failed.unread == ("unread",) and not failed.shortage
    assert slot.ref is None  # detached before the hand-over was sent, not by a failed tell
    slot.tell("after the crash")
    assert slot._held == ["after the crash"]


# -- the root ------------------------------------------------------------------


def test_crashed_permanent_child_gets_its_unread_messages_in_order(rig: Callable[..., Rig]) -> None:
    # the mailbox of the crashed child is replayed to its successor,
    # ahead of anything told after the crash
    r = rig()
    b = r.slots["b"].ref
    _held_then_crash(r, "a", ["m1", "m2", "m3"])
    r.slots["a"].tell("m4")
    assert [r.seen["a"].next() for _ in range(4)] == [(1, "m1"), (1, "m2"), (1, "m3"), (1, "m4")]
    r.sync()
    assert r.slots["b"].ref is b and b is not None and b.is_alive()  # one_for_one: untouched
    r.seen["b"].assert_nothing()
    assert r.fatal == []


def test_crash_loop_past_the_intensity_is_fatal(rig: Callable[..., Rig]) -> None:
    # one intensity over all children: a, b, a, b is four restarts
    r = rig(max_restarts=3)
    for name in ("a", "b", "a"):
        r.crash(name)
    assert r.fatal == []
    r.slots["b"].tell(Boom())
    wait_for(lambda: r.fatal, what="the root gives up")
    assert r.fatal == ["4 crashes within 10s (a, b; last b); last error: RuntimeError: boom"]


def test_restarts_older_than_the_window_are_forgotten(rig: Callable[..., Rig]) -> None:
    # a window that never expires would give up here
    r = rig(max_restarts=2, window_s=10)
    r.crash("a")
    r.crash("a")
    r.clock.now += 10.5
    r.crash("a")
    r.crash("a")
    assert r.fatal == []
    r.crash("a")
    assert r.fatal == ["a crashed 3 times within 10s; last error: RuntimeError: boom"]


def test_shortage_backs_off_and_is_not_counted(
    rig: Callable[..., Rig], capsys: pytest.CaptureFixture[str]
) -> None:
    # EMFILE and the like are retried after 0.1 s, 0.2 s, ... (a message
    # scheduled for later, not a sleep), reported once, and never end the daemon
    r = rig(("a",), max_restarts=1)
    release = threading.Event()
    for attempt in range(6):
        before = r.slots["a"].ref
        if attempt == 0:  # the first one also leaves unread work behind
            r.slots["a"].tell(Hold(release))
        r.slots["a"].tell(Short())
        if attempt == 0:
            r.slots["a"].tell("unread")
            release.set()
        wait_for(lambda n=attempt: len(r.schedule.delays) == n + 1, what="restart scheduled")  # type: ignore[misc]
        assert r.slots["a"].ref is None or not r.slots["a"].ref.is_alive()
        r.slots["a"].tell(f"while down {attempt}")
        r.schedule.fire()
        wait_for(lambda b=before: r.slots["a"].ref not in (None, b), what="restarted")  # type: ignore[misc]
        if attempt == 0:  # replayed after the delay too, ahead of what waited in the slot
            assert r.seen["a"].next() == (1, "unread")
        assert r.seen["a"].next() == (attempt + 1, f"while down {attempt}")
    assert r.schedule.delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2]
    assert r.fatal == []
    err = capsys.readouterr().err
    assert err.count("ran short of a resource") == 1
    assert "[Errno 24] short" in err
    r.crash("a")  # a plain crash still counts: one is allowed...
    r.crash("a")  # ...two are not
    assert r.fatal and r.fatal[0].startswith("a crashed 2 times within 10s")


def test_a_factory_that_cannot_start_a_thread_backs_off(rig: Callable[..., Rig]) -> None:
    # a thread that cannot be started is a shortage, not a crash loop
    slot = Slot("flaky")
    seen = FakeRef("seen")
    attempts: list[int] = []

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        attempts.append(n)
        if n < 3:
            raise RuntimeError("can't start new thread")
        return Recorder.start(supervisor=sup, seen=seen, name="flaky", incarnation=n)

    schedule, fatal = FakeSchedule(), list[str]()
    root = RootSupervisor.start(
        specs=[ChildSpec(slot, start)], on_fatal=fatal.append, max_restarts=1, window_s=10,
        clock=FakeClock(), schedule=schedule,
    )
    slot.tell("waits for a thread")
    wait_for(lambda: schedule.delays, what="first retry scheduled")
    for count in (2, 3):
        schedule.fire()
        wait_for(lambda c=count: len(schedule.delays) == c or slot.ref, what="next retry")  # type: ignore[misc]
    schedule.fire()
    assert seen.next() == (3, "waits for a thread")
    assert schedule.delays == [0.1, 0.2, 0.4] and fatal == []
    root.stop()


class StopRecorder(Recorder):
    """Notes, in its own on_stop, that it was stopped (the root waits for each in turn)."""

    stops: ClassVar[list[str]] = []

    def on_stop(self) -> None:
        StopRecorder.stops.append(self.child_name)


def test_stop_goes_in_reverse_start_order() -> None:
    names = ("first", "second", "third")
    slots = {n: Slot(n) for n in names}

    def factory(name: str) -> Callable[[Address, int], pykka.ActorRef[Any]]:
        def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
            return StopRecorder.start(supervisor=sup, seen=FakeRef(), name=name, incarnation=n)
        return start

    StopRecorder.stops = []
    root = RootSupervisor.start(
        specs=[ChildSpec(slots[n], factory(n)) for n in names], on_fatal=lambda r: None,
        max_restarts=5, window_s=10,
    )
    for slot in slots.values():
        wait_for(lambda s=slot: s.ref, what=f"{slot.name} started")  # type: ignore[misc]
    root.stop(block=True, timeout=5)
    assert StopRecorder.stops == ["third", "second", "first"]


# -- Delivery's hand-over ------------------------------------------------------


def test_delivery_crashed_mid_send_still_sends_both_in_order(tmp_path: Path) -> None:
    # the send under way at the crash goes on (hermes is never killed); the successor
    # waits for it and takes its outcome, then runs the queued one: each once, in order
    hermes = FakeHermes(tmp_path / "bin", sleep=1)
    slot = Slot("delivery")
    question_a, question_b = FakeRef("a"), FakeRef("b")

    others: dict[str, Any] = {role: FakeRef(role) for role in ROLES[1:]}
    config = bridge_config(hermes=str(hermes.path), target="telegram", hermes_profile=None,
                           send_timeout_ms=60_000, state_path=tmp_path / "state-d.sqlite3")
    store = Store.open(config.state_path)
    for qid in (QID_A, QID_B):  # open and pending: their sends' outcomes are owed
        store.put_open(question_spec(qid=qid, state="pending"), owner=f"question:{qid}")
    wiring = Wiring(config, store, **{**others, "delivery": slot})

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return DeliveryActor.start(wiring, supervisor=sup)

    root = RootSupervisor.start(specs=[ChildSpec(slot, start)], on_fatal=lambda r: None,
                                max_restarts=5, window_s=10)
    wait_for(lambda: slot.ref, what="delivery up")
    job_a = SendText(QID_A, "question A", "question", reply_to=question_a)
    job_b = SendText(QID_B, "question B", "question", reply_to=question_b)
    slot.tell(job_a)
    slot.tell(job_b)
    hermes.wait_started(1)
    before = slot.ref
    hermes.configure(sleep=0)
    slot.tell(Boom())  # Delivery takes no such thing: it crashes mid-send
    wait_for(lambda: slot.ref not in (None, before), what="delivery restarted")
    assert question_a.expect(HermesRan) == HermesRan(job_a, None)
    assert question_b.expect(HermesRan) == HermesRan(job_b, None)
    assert [argv[-1] for argv in hermes.argvs()] == ["question A", "question B"]
    assert len(hermes.started()) == 2
    root.stop()
    store.shutdown()


def test_operator_lines_from_threads_at_once_never_run_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # children start side by side and report at once: each line must stay whole
    def go(n: int) -> None:
        for i in range(300):
            report(f"thread {n} line {i}")

    threads = [threading.Thread(target=go, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1200
    assert all(re.fullmatch(r"coms-hermes-bridge: thread \d line \d+", line) for line in lines)


def test_no_tell_through_a_slot_is_lost_while_its_child_crashes(rig: Callable[..., Rig]) -> None:
    # four threads tell through the slot while the child crashes again
    # and again; every message is read exactly once, by one incarnation or the next,
    # and each thread's messages in the order it told them
    r = rig(("a",), max_restarts=1000)
    slot, seen = r.slots["a"], r.seen["a"]
    per_thread = 400

    def tell_many(n: int) -> None:
        for i in range(per_thread):
            slot.tell((n, i))

    threads = [threading.Thread(target=tell_many, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(10):
        slot.tell(Boom())
    for thread in threads:
        thread.join()
    got = [seen.next()[1] for _ in range(4 * per_thread)]
    slot.tell("last")  # after every tell above: a message read twice would come before it
    assert seen.next()[1] == "last"
    assert sorted(got) == sorted((n, i) for n in range(4) for i in range(per_thread))
    for n in range(4):
        assert [i for m, i in got if m == n] == list(range(per_thread))
    assert r.fatal == []


# -- what the operator reads, and the end of the line ------


def test_giving_up_is_one_error_line_and_nothing_restarts_after_it(
    rig: Callable[..., Rig], capsys: pytest.CaptureFixture[str]
) -> None:
    # past the intensity the root gives up once, for good, and
    # the operator's line carries the level journald and grep filter on
    r = rig(max_restarts=1)
    r.crash("a")
    r.crash("a")
    assert r.fatal == ["a crashed 2 times within 10s; last error: RuntimeError: boom"]
    b = r.slots["b"].ref
    assert b is not None
    r.slots["b"].tell(Boom())
    wait_for(lambda: not b.is_alive(), what="b died")
    r.slots["b"].tell("after the end")
    r.sync()  # b's ChildFailed, told before b was dead, is handled
    assert r.slots["b"].ref is None  # not restarted: the daemon is going down
    r.seen["b"].assert_nothing()
    assert len(r.fatal) == 1
    err = capsys.readouterr().err
    assert err.count("coms-hermes-bridge: error: a crashed 2 times within 10s") == 1
    assert "coms-hermes-bridge: warning: a crashed (RuntimeError: boom); restarting it" in err


def test_each_child_short_of_a_resource_has_its_own_backoff_and_episode(
    rig: Callable[..., Rig], capsys: pytest.CaptureFixture[str]
) -> None:
    # the backoff is per child: one child's shortage does not lengthen
    # another's first delay or hide its warning line
    r = rig(("a", "b"))
    r.slots["a"].tell(Short())
    wait_for(lambda: len(r.schedule.delays) == 1, what="a's restart scheduled")
    r.slots["b"].tell(Short())
    wait_for(lambda: len(r.schedule.delays) == 2, what="b's restart scheduled")
    assert r.schedule.delays == [0.1, 0.1]
    err = capsys.readouterr().err
    for name in ("a", "b"):
        assert err.count(f"coms-hermes-bridge: warning: {name} ran short of a resource (") == 1
    assert r.fatal == []


def test_a_backoff_episode_lasts_until_the_cap_has_passed_since_the_last_delay() -> None:
    # one warning per episode; a shortage exactly `max_s` after the last
    # delay ran out is still the same episode, one later starts a new one
    clock = FakeClock()
    backoff = Backoff(clock, first_s=1.0, max_s=8.0)
    assert backoff.next("a") == (1.0, True)
    clock.now += 1.0 + 8.0
    assert backoff.next("a") == (2.0, False)
    clock.now += 2.0 + 8.0 + 0.5
    assert backoff.next("a") == (1.0, True)


def test_the_default_schedule_runs_a_restart_later_on_the_edge() -> None:
    # a backoff delay is a call set for later on the one loop's timers, never a sleep
    assert inspect.signature(RootSupervisor).parameters["schedule"].default is later
    ran: list[bool] = []
    fired = threading.Event()
    later(0.05, lambda: ran.append(shared_edge().on_loop()))
    later(0.1, fired.set)  # due after it: by then it has run
    wait_for(fired.is_set, what="the later call ran")
    assert ran == [True]


def test_a_crash_of_the_root_itself_is_fatal_with_its_reason(rig: Callable[..., Rig]) -> None:
    # nothing supervises the root; its own failure ends the daemon, saying why
    r = rig(("a",))
    r.ref.tell("no such message")
    wait_for(lambda: r.fatal, what="the root gives up")
    assert r.fatal[0].startswith("supervisor failed: UnknownMessage(")


def test_an_episode_is_said_when_it_begins_and_counted_when_it_ends() -> None:
    # one throttle for "report a recurring fault once per episode"
    episode = Episode()
    assert episode.over() == 0  # nothing was going on
    assert [episode.happened() for _ in range(3)] == [True, False, False]
    assert episode.over() == 3
    assert episode.over() == 0
    assert episode.happened() is True  # a new episode is said again
    assert [episode.happened(c) for c in ("ENOENT", "ENOENT", "ENOTDIR", "ENOTDIR")] == [
        True, False, True, False
    ]  # a new cause mid-episode is news: said once too
    assert episode.over() == 5


# -- the restart policy both supervisors use -------------------------------------


def test_the_policy_restarts_now_puts_a_shortage_off_and_gives_up_past_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock, schedule, me = FakeClock(), FakeSchedule(), FakeRef("me")
    policy = RestartPolicy(1, 10.0, clock, schedule, per_child=True)
    assert policy.crashed("a", "RuntimeError: boom", (), False, me, who="question q") == "now"
    assert policy.crashed("a", "OSError: out of fds", ("u1",), True, me) == "later"
    assert schedule.delays == [0.1]
    schedule.fire()
    assert me.next() == RestartChild("a", ("u1",))
    verdict = policy.crashed("a", "RuntimeError: boom", (), False, me, who="question q")
    assert verdict == GiveUp("question q crashed 2 times within 10s")
    assert policy.crashed("b", "RuntimeError: boom", (), False, me) == "now"  # its own count
    assert capsys.readouterr().err.splitlines() == [
        "coms-hermes-bridge: warning: a crashed (RuntimeError: boom); restarting it",
        "coms-hermes-bridge: warning: a ran short of a resource (OSError: out of fds); "
        "restarting it with backoff from 0.1s up to 30s",
        "coms-hermes-bridge: warning: b crashed (RuntimeError: boom); restarting it",
    ]


def test_a_crash_that_is_no_shortage_ends_the_backoff_episode() -> None:
    clock, schedule, me = FakeClock(), FakeSchedule(), FakeRef("me")
    policy = RestartPolicy(10, 10.0, clock, schedule, per_child=True)
    policy.crashed("a", "short", (), True, me)
    policy.crashed("a", "short", (), True, me)
    policy.crashed("a", "bug", (), False, me)
    policy.crashed("a", "short", (), True, me)
    assert schedule.delays == [0.1, 0.2, 0.1]  # the third shortage starts afresh


def test_a_forgotten_child_loses_its_history() -> None:
    clock, schedule, me = FakeClock(), FakeSchedule(), FakeRef("me")
    policy = RestartPolicy(1, 10.0, clock, schedule, per_child=True)
    assert policy.crashed("a", "bug", (), False, me) == "now"
    policy.crashed("a", "short", (), True, me)
    policy.crashed("b", "short", (), True, me)
    policy.forget("a")
    policy.crashed("a", "short", (), True, me)
    policy.crashed("b", "short", (), True, me)
    assert schedule.delays == [0.1, 0.1, 0.1, 0.2]  # a's backoff afresh, not b's
    assert policy.crashed("a", "bug", (), False, me) == "now"  # and a's count
    # a restart put off before is not taken back: where it lands, it finds nothing to do
    schedule.fire()
    assert me.next() == RestartChild("a", ())


def test_a_put_off_restart_that_comes_after_the_root_stopped_starts_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slot, starts, schedule = Slot("a"), list[int](), FakeSchedule()

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        starts.append(n)
        return Recorder.start(supervisor=sup, seen=FakeRef("seen"), name="a", incarnation=n)

    root = RootSupervisor.start(specs=[ChildSpec(slot, start)], on_fatal=lambda r: None,
                                max_restarts=5, window_s=10, clock=FakeClock(),
                                schedule=schedule)
    wait_for(lambda: slot.ref, what="a started")
    slot.tell(Short())
    wait_for(lambda: schedule.delays, what="the restart put off")
    root.stop(block=True, timeout=5)
    capsys.readouterr()
    schedule.fire()  # its RestartChild, to a root that is gone
    assert starts == [0] and slot.ref is None and slot._held == []
    assert capsys.readouterr().err == ""


def test_a_child_that_cannot_start_is_restarted_as_if_it_had_crashed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slot, seen = Slot("flaky"), FakeRef("seen")

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        if n == 0:
            raise ValueError("bad config")
        return Recorder.start(supervisor=sup, seen=seen, name="flaky", incarnation=n)

    slot.tell("waits")
    root = RootSupervisor.start(specs=[ChildSpec(slot, start)], on_fatal=lambda r: None,
                                max_restarts=5, window_s=10, clock=FakeClock())
    assert seen.next() == (1, "waits")
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: warning: flaky crashed (ValueError: bad config); restarting it\n"
    )
    root.stop()


def test_nothing_restarts_once_the_root_gave_up(rig: Callable[..., Rig]) -> None:
    # a restart put off before the verdict, and a crash after it, are both let be
    r = rig(("a", "b", "c"), max_restarts=1)
    r.slots["a"].tell(Short())
    wait_for(lambda: r.schedule.delays, what="a's restart put off")
    r.crash("b")
    r.crash("b")
    assert r.fatal and r.fatal[0].startswith("b crashed 2 times")
    r.schedule.fire()
    r.clock.now += 60  # past the window: only the verdict keeps c down
    c = r.slots["c"].ref
    r.slots["c"].tell(Boom())
    wait_for(lambda: c is not None and not c.is_alive(), what="c crashed")
    r.sync()
    assert r.slots["a"].ref is None and r.slots["c"].ref is None


def test_an_unknown_message_to_the_root_names_itself_and_the_message(
    rig: Callable[..., Rig],
) -> None:
    r = rig(("a",))
    r.ref.tell(("no", "such"))
    wait_for(lambda: r.fatal, what="the root gives up")
    assert r.fatal == [
        "supervisor failed: UnknownMessage(\"supervisor does not take tuple: ('no', 'such')\")"
    ]


class SlowStop(Recorder):
    """Takes its time to stop, as a child stuck in a blocking call would."""

    def on_stop(self) -> None:
        time.sleep(2)


def test_a_child_slow_to_stop_holds_the_root_no_longer_than_its_shutdown_time() -> None:
    slot = Slot("slow")

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return SlowStop.start(supervisor=sup, seen=FakeRef(), name="slow", incarnation=n)

    root = RootSupervisor.start(specs=[ChildSpec(slot, start, shutdown_s=0.2)],
                                on_fatal=lambda r: None, max_restarts=5, window_s=10)
    wait_for(lambda: slot.ref, what="slow started")
    began = time.monotonic()
    root.stop(block=True, timeout=5)
    assert time.monotonic() - began < 1.5


def test_a_child_restarted_after_its_backoff_stops_with_the_root(
    rig: Callable[..., Rig],
) -> None:
    r = rig(("a",))
    before = r.slots["a"].ref
    r.slots["a"].tell(Short())
    wait_for(lambda: r.schedule.delays, what="the restart put off")
    r.schedule.fire()
    after = wait_for(lambda: r.slots["a"].ref not in (None, before) and r.slots["a"].ref,
                     what="a restarted")
    r.ref.stop(block=True, timeout=5)
    assert not after.is_alive() and r.slots["a"].ref is None


# -- the operator's line (C18) and what counts as a shortage -----------------------


def test_a_report_is_one_line_of_at_most_max_report_characters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report("first\nsecond\r\nthird", "warning")
    assert capsys.readouterr().err == "coms-hermes-bridge: warning: first second third\n"
    report("x" * MAX_REPORT)  # at the limit: whole
    assert capsys.readouterr().err == f"coms-hermes-bridge: {'x' * MAX_REPORT}\n"
    report("x" * (MAX_REPORT + 1))  # past it: cut, the cut said with an ellipsis
    assert capsys.readouterr().err == f"coms-hermes-bridge: {'x' * (MAX_REPORT - 1)}…\n"


@pytest.mark.parametrize(
    ("stream", "level", "line"),
    [
        ("ours", "error", "<3>coms-hermes-bridge: error: x\n"),
        ("ours", "warning", "<4>coms-hermes-bridge: warning: x\n"),
        ("ours", "info", "<6>coms-hermes-bridge: info: x\n"),
        ("ours", None, "coms-hermes-bridge: x\n"),
        ("another", "error", "coms-hermes-bridge: error: x\n"),
        ("", "error", "coms-hermes-bridge: error: x\n"),
        (None, "error", "coms-hermes-bridge: error: x\n"),
    ],
)
def test_under_journald_a_leveled_line_starts_with_its_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: str | None, level: Any, line: str
) -> None:  # C18: journalctl -p reads <N>; only when stderr is the journal's own stream
    import os
    import sys

    err = tmp_path / "stderr"
    with err.open("w", encoding="utf-8") as file:
        st = os.fstat(file.fileno())
        values = {"ours": f"{st.st_dev}:{st.st_ino}", "another": f"{st.st_dev}:{st.st_ino + 1}"}
        if stream is None:
            monkeypatch.delenv("JOURNAL_STREAM", raising=False)
        else:
            monkeypatch.setenv("JOURNAL_STREAM", values.get(stream, stream))
        monkeypatch.setattr(sys, "stderr", file)
        report("x", level)
    assert err.read_text(encoding="utf-8") == line


def test_a_child_whose_start_fails_is_out_of_the_registry_before_it_releases() -> None:
    # dead first, as pykka does before on_failure: nothing finds it while it lets go
    found: list[object] = []

    class FailsToStart(Child):
        def begin(self) -> None:
            raise RuntimeError("cannot start")

        def release(self) -> None:
            found.append(pykka.ActorRegistry.get_by_urn(self.actor_urn))

    supervisor = FakeRef("supervisor")
    FailsToStart.start("x", supervisor)
    failed = supervisor.expect(ChildFailed)
    assert (failed.child, failed.error) == ("x", "RuntimeError: cannot start")
    assert found == [None]


def test_a_stderr_without_a_descriptor_is_never_taken_for_the_journal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # C18: no <N> prefix unless stderr is the journal's own stream
    import io
    import sys

    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    buffer = io.StringIO()  # fileno() raises io.UnsupportedOperation
    monkeypatch.setattr(sys, "stderr", buffer)
    report("x", "error")
    assert buffer.getvalue() == "coms-hermes-bridge: error: x\n"


def test_the_wall_clock_actors_are_given_is_utc() -> None:  # C20: log times are UTC
    from datetime import UTC

    assert utc_now().tzinfo is UTC


def test_a_shortage_is_found_through_an_implicit_context_and_a_cycle_ends_the_search() -> None:
    inner = OSError(errno.ENOMEM, "Cannot allocate memory")
    implicit = RuntimeError("while handling it")
    implicit.__context__ = inner  # raised while handling `inner`, no `from`
    assert is_resource_shortage(implicit)
    looped = RuntimeError("a")
    other = ValueError("b")
    looped.__context__, other.__context__ = other, looped  # a cycle: no shortage in it
    assert is_resource_shortage(looped) is False


def test_an_ask_left_in_a_crashed_childs_mailbox_fails_with_the_childs_name(
    rig: Callable[..., Rig],
) -> None:  # its caller must not wait for an answer that will never come
    r = rig(("a",))
    release = threading.Event()
    before = r.slots["a"].ref
    assert before is not None
    r.slots["a"].tell(Hold(release))
    r.slots["a"].tell(Boom())
    future = before.ask("are you there?", block=False)
    release.set()
    with pytest.raises(pykka.ActorDeadError, match=r"^a$"):
        future.get(timeout=5)


class ForgetsWhatItTook(Recorder):
    """A child whose own list of work taken fails: its mailbox is still handed over."""

    def taken(self) -> tuple[Any, ...]:
        raise RuntimeError("lost track")


def test_a_failing_taken_still_hands_the_mailbox_over() -> None:
    supervisor = FakeRef("supervisor")
    ref = ForgetsWhatItTook.start(supervisor=supervisor, seen=FakeRef("seen"), name="a",
                                  incarnation=0)
    release = threading.Event()
    for message in (Hold(release), Boom(), "m1", "m2"):
        ref.tell(message)
    release.set()
    failed = supervisor.next()
    assert (failed.child, failed.unread) == ("a", ("m1", "m2"))
