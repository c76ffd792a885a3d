"""Supervision promises with fake children: the root, slots, the restart intensity.

The children here are tiny actors that forward whatever they read to a FakeRef,
so a test sees exactly which messages each incarnation got, in which order. The
clock is injected, so windows are tested without waiting for them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pykka
import pytest

from coms_hermes_bridge.actors.delivery import DeliveryActor, question_send
from coms_hermes_bridge.actors.loop import MAX_REPORT, Episode, report, utc_now
from coms_hermes_bridge.actors.store import Store
from coms_hermes_bridge.actors.supervision import GiveUp, Intensity, RestartPolicy, Slot
from coms_hermes_bridge.actors.supervisor import ChildSpec, RootSupervisor
from coms_hermes_bridge.messages.commands import Address, ChildFailed, HermesRan
from tests.fakes import (
    ROLES,
    ActorRig,
    Boom,
    Child,
    FakeClock,
    FakeRef,
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
    it read; its clock is the test's. `options` are the root's own."""

    def __init__(self, names: tuple[str, ...], **options: Any) -> None:
        self.slots = {n: Slot(n) for n in names}
        self.seen = {n: FakeRef(n) for n in names}
        self.clock = FakeClock()
        self.fatal: list[str] = []
        specs = [ChildSpec(self.slots[n], self._starter(n)) for n in names]
        super().__init__(RootSupervisor, (), specs=specs, on_fatal=self.fatal.append,
                         clock=self.clock, **options)
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


# -- slots ---------------------------------------------------------------------


def test_a_slot_drops_what_is_told_while_nothing_live_is_bound() -> None:
    # as in OTP: a message to a dead or not-yet-started child is lost (what matters is
    # in the store), and a retired slot stays pointing nowhere
    seen = FakeRef("seen")
    slot = Slot("x")
    slot.tell("before any child")
    ref = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=0)
    slot.bind(ref)
    slot.tell("to the child")
    assert seen.next() == (0, "to the child")
    ref.stop(block=True)
    slot.tell("to a dead child")  # no raise
    successor = Recorder.start(supervisor=FakeRef(), seen=seen, name="x", incarnation=1)
    slot.bind(successor)
    slot.tell("to its successor")
    assert seen.next() == (1, "to its successor")
    slot.retire()
    slot.bind(successor)
    slot.tell("after retirement")
    assert slot.ref is None
    seen.assert_nothing()
    successor.stop()


# -- the root ------------------------------------------------------------------


def test_a_crashed_child_restarts_empty_and_its_sibling_is_untouched(
    rig: Callable[..., Rig],
) -> None:
    # promise 2: one_for_one; what the crashed child had not read is gone (a restart is
    # a start), and what is told after the restart reaches the successor
    r = rig()
    b = r.slots["b"].ref
    _held_then_crash(r, "a", ["m1", "m2", "m3"])
    r.slots["a"].tell("m4")
    assert r.seen["a"].next() == (1, "m4")
    r.sync()
    assert r.slots["b"].ref is b and b is not None and b.is_alive()
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


# -- Delivery's crash ------------------------------------------------------------


def test_delivery_crashed_mid_send_still_sends_both_in_order(tmp_path: Path) -> None:
    # promise 1: the send under way at the crash goes on (hermes is never killed); the
    # successor waits for it and takes its outcome, then sends what the store owes: each
    # once, in order, each result to the Router
    hermes = FakeHermes(tmp_path / "bin", sleep=1)
    slot = Slot("delivery")
    others: dict[str, Any] = {role: FakeRef(role) for role in ROLES[1:]}
    config = bridge_config(hermes=str(hermes.path), target="telegram", hermes_profile=None,
                           send_timeout_ms=60_000, state_path=tmp_path / "state-d.sqlite3")
    store = Store.open(config.state_path)
    specs = [question_spec(qid=qid, state="pending") for qid in (QID_A, QID_B)]
    for spec in specs:  # open and pending: their sends are owed
        store.put_open(spec, owner=f"question:{spec.qid}")

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        return DeliveryActor.start_bound(slot.bind, config=config, store=store,
                                         router=others["router"], logger=others["logger"],
                                         supervisor=sup)

    root = RootSupervisor.start(specs=[ChildSpec(slot, start)], on_fatal=lambda r: None,
                                max_restarts=5, window_s=10)
    hermes.wait_started(1)  # queued from the store at its start
    before = slot.ref
    hermes.configure(sleep=0)
    slot.tell(Boom())  # Delivery takes no such thing: it crashes mid-send
    wait_for(lambda: slot.ref not in (None, before), what="delivery restarted")
    jobs = [question_send(spec, config) for spec in specs]
    router = others["router"]
    assert [router.expect(HermesRan) for _ in jobs] == [HermesRan(job, None) for job in jobs]
    assert [argv[-1] for argv in hermes.argvs()] == [job.text for job in jobs]
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
    assert r.slots["b"].ref is b  # not restarted: the daemon is going down
    r.seen["b"].assert_nothing()
    assert len(r.fatal) == 1
    err = capsys.readouterr().err
    assert err.count("coms-hermes-bridge: error: a crashed 2 times within 10s") == 1
    assert "coms-hermes-bridge: warning: a crashed (RuntimeError: boom); restarting it" in err


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


def test_the_policy_restarts_now_and_gives_up_past_the_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = FakeClock()
    policy = RestartPolicy(1, 10.0, clock, per_child=True)
    assert policy.crashed("a", "RuntimeError: boom", who="question q") == "now"
    verdict = policy.crashed("a", "RuntimeError: boom", who="question q")
    assert verdict == GiveUp("question q crashed 2 times within 10s")
    assert policy.crashed("b", "OSError: [Errno 24] out of fds") == "now"  # its own count
    assert capsys.readouterr().err.splitlines() == [
        "coms-hermes-bridge: warning: a crashed (RuntimeError: boom); restarting it",
        "coms-hermes-bridge: warning: b crashed (OSError: [Errno 24] out of fds); restarting it",
    ]


def test_a_forgotten_child_loses_its_history() -> None:
    policy = RestartPolicy(1, 10.0, FakeClock(), per_child=True)
    assert policy.crashed("a", "bug") == "now"
    policy.forget("a")
    assert policy.crashed("a", "bug") == "now"  # a's count afresh
    assert isinstance(policy.crashed("a", "bug"), GiveUp)


def test_a_machine_short_of_a_resource_counts_as_any_crash(rig: Callable[..., Rig]) -> None:
    # promise 2: no backoff in the daemon; past the bound it exits 1 and the service
    # manager restarts it later and later (the unit's RestartSteps)
    r = rig(("a",), max_restarts=1)
    r.crash("a", Short())
    r.crash("a", Short())
    assert r.fatal == ["a crashed 2 times within 10s; last error: OSError: [Errno 24] short"]


def test_a_child_that_cannot_start_is_restarted_as_if_it_had_crashed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    slot, seen = Slot("flaky"), FakeRef("seen")

    def start(sup: Address, n: int) -> pykka.ActorRef[Any]:
        if n == 0:
            raise ValueError("bad config")
        return Recorder.start(supervisor=sup, seen=seen, name="flaky", incarnation=n)

    root = RootSupervisor.start(specs=[ChildSpec(slot, start)], on_fatal=lambda r: None,
                                max_restarts=5, window_s=10, clock=FakeClock())
    wait_for(lambda: slot.ref, what="flaky started at its second try")
    slot.tell("to it")
    assert seen.next() == (1, "to it")
    assert capsys.readouterr().err == (
        "coms-hermes-bridge: warning: flaky crashed (ValueError: bad config); restarting it\n"
    )
    root.stop()


def test_nothing_restarts_once_the_root_gave_up(rig: Callable[..., Rig]) -> None:
    # a crash after the verdict is let be
    r = rig(("a", "b", "c"), max_restarts=1)
    r.crash("b")
    r.crash("b")
    assert r.fatal and r.fatal[0].startswith("b crashed 2 times")
    r.clock.now += 60  # past the window: only the verdict keeps c down
    c = r.slots["c"].ref
    r.slots["c"].tell(Boom())
    wait_for(lambda: c is not None and not c.is_alive(), what="c crashed")
    r.sync()
    assert r.slots["c"].ref is c


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


# -- the operator's line (C18) --------------------------------------------------------


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
